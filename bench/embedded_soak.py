"""python -m bench embedded_soak [--seconds N]: `serve` in the embedded default, under load, for N seconds.

Starts `manage.py serve` with nothing but Python (SQLite, the SQLite broker) in a scratch folder,
makes the simulated hardware fast, then for N seconds (default 600): a client loads every page once
a second, every pool has a train with an upgrade to apply, ad-hoc reboots are submitted through the
API every few seconds, and (with BENCH_SOAK_CPU_LOAD=1, the default) another process keeps one core
busy, as another job on the machine would. Reports the children's crashes (goal 0), the pages that
failed, the operations finished and the page latency. A short run of the same is in the tests.
"""

from __future__ import annotations

import base64
import http.cookiejar
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import ROOT, Figure

DEFAULT_SECONDS = 600.0
FAST_HARDWARE = (
    "from opsplanner.models import SimulatorProfile as P; p = P.current(); "
    "p.drain_seconds = 2; p.execute_seconds = 3; p.verify_seconds = 1; p.undrain_seconds = 1; p.save()"
)
PAGES = ("/", "/gantt/", "/events/", "/approvals/", "/trains/", "/trains/upgrades/", "/fleet/services/")
CPU_BURNER = "import time\nwhile True:\n    sum(range(100000))\n"


@dataclass
class SoakResult:
    seconds: float
    crashes: int
    serve_alive: bool
    page_loads: int
    page_errors: list[str]
    latencies_ms: list[float] = field(repr=False)
    operations_submitted: int
    operations_finished: int
    first_visit_running_s: float | None  # from the console's start; None: no visit ran within 60 s
    approvals_waiting: int
    serve_output: str = field(repr=False)

    def percentile(self, share: float) -> float:
        if not self.latencies_ms:
            return 0.0
        ordered = sorted(self.latencies_ms)
        return ordered[min(int(share * len(ordered)), len(ordered) - 1)]


class _Client:
    """A logged-in browser session (cookies, CSRF) and an API token, over plain HTTP."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        self.token = ""

    def get(self, path: str, timeout: float = 30) -> tuple[int, str]:
        try:
            with self.opener.open(self.base + path, timeout=timeout) as response:
                return response.status, response.read().decode(errors="replace")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")
        except OSError as error:
            return 0, str(error)

    def log_in(self, username: str, password: str) -> None:
        status, page = self.get("/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        if status != 200 or token is None:
            raise RuntimeError(f"login page answered {status}")
        form = {"username": username, "password": password, "csrfmiddlewaretoken": token.group(1), "next": "/"}
        request = urllib.request.Request(
            self.base + "/login/", data=urllib.parse.urlencode(form).encode(), headers={"Referer": self.base}
        )
        with self.opener.open(request, timeout=30):
            pass
        basic = base64.b64encode(f"{username}:{password}".encode()).decode()
        answer = self.api("POST", "/api/auth/login/", None, auth=f"Basic {basic}")
        self.token = answer["token"]

    def api(self, method: str, path: str, body: dict | None, *, auth: str = "") -> dict:
        request = urllib.request.Request(
            self.base + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": auth or f"Token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read() or b"{}")


def soak(seconds: float, *, demo_hosts: int = 2000, cpu_load: bool = True, var_dir: Path | None = None) -> SoakResult:
    var = var_dir or Path(tempfile.mkdtemp(prefix="opsplanner-soak-")) / "var"
    env = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL"}}
    env.update({"DEBUG": "1", "OPSPLANNER_VAR_DIR": str(var)})
    port = _free_port()
    output = var.parent / "serve.log"
    var.mkdir(parents=True, exist_ok=True)
    with output.open("wb") as sink:
        serve = subprocess.Popen(
            [sys.executable, "manage.py", "serve", "--port", str(port), "--demo-hosts", str(demo_hosts)],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    burner = subprocess.Popen([sys.executable, "-c", CPU_BURNER]) if cpu_load else None
    client = _Client(f"http://127.0.0.1:{port}")
    try:
        _wait(lambda: client.get("/healthz/workers")[0] == 200 or serve.poll() is not None, timeout=300)
        if serve.poll() is not None:
            raise RuntimeError("serve stopped while starting:\n" + output.read_text()[-3000:])
        subprocess.run([sys.executable, "manage.py", "shell", "-c", FAST_HARDWARE], cwd=ROOT, env=env, check=True)
        ready = time.monotonic()
        password = (var / "demo-credentials.txt").read_text().strip()
        client.log_in("operator", password)
        first_visit = _seconds_until_a_visit_runs(client, since=ready, within=60)
        approvals = client.api("GET", "/api/approvals/?state=pending", None)["count"]
        submitted, loads, errors, latencies = _drive(client, seconds)
        finished = client.api("GET", "/api/operations/?state=completed", None).get("count", 0)
    finally:
        alive = serve.poll() is None
        if burner is not None:
            burner.kill()
            burner.wait()
        serve.send_signal(signal.SIGINT)
        try:
            serve.wait(timeout=60)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
    text = output.read_text(errors="replace")
    return SoakResult(
        seconds=seconds,
        crashes=len(re.findall(r"^\S+ exited with code", text, re.M)),
        serve_alive=alive,
        page_loads=loads,
        page_errors=errors,
        latencies_ms=latencies,
        operations_submitted=submitted,
        operations_finished=finished,
        first_visit_running_s=first_visit,
        approvals_waiting=approvals,
        serve_output=text,
    )


def _seconds_until_a_visit_runs(client: _Client, *, since: float, within: float) -> float | None:
    """The demo comes alive by itself: how long until a train's visit is running (or already done)."""
    while time.monotonic() - since < within:
        if client.api("GET", "/api/visits/?state=running&state=done", None)["count"]:
            return round(time.monotonic() - since, 1)
        time.sleep(1)
    return None


def _drive(client: _Client, seconds: float) -> tuple[int, int, list[str], list[float]]:
    """Trains with upgrades on every pool (the demo's, or ours), ad-hoc reboots, every page once a second."""
    pools = client.api("GET", "/api/pools/?page_size=100", None)["results"]
    for pool in pools:
        if not client.api("GET", f"/api/trains/?pool={pool['id']}", None)["count"]:
            _start_train(client, pool)
    hosts = client.api("GET", "/api/hosts/?page_size=1000", None)["results"]
    pages = [*PAGES, *(f"/fleet/pools/{pool['name']}/" for pool in pools)]
    pages += [f"/fleet/hosts/{host['hostname']}/" for host in hosts[:2]]
    stop = threading.Event()
    submitted = [0]
    submitter = threading.Thread(target=_submit_reboots, args=(client, hosts, stop, submitted), daemon=True)
    submitter.start()
    loads, errors, latencies = 0, [], []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        second = time.monotonic()
        for page in pages:
            started = time.perf_counter()
            status, _ = client.get(page)
            latencies.append((time.perf_counter() - started) * 1000)
            loads += 1
            if status != 200:
                errors.append(f"{page}: {status}")
        time.sleep(max(0.0, 1.0 - (time.monotonic() - second)))
    stop.set()
    submitter.join(timeout=60)
    return submitted[0], loads, errors, latencies


def _start_train(client: _Client, pool: dict) -> None:
    client.api(
        "POST",
        "/api/trains/",
        {"pool": pool["id"], "name": f"soak-{pool['name']}", "cycle_slo_s": 3600, "visit_estimate_s": 60},
    )
    components = client.api("GET", "/api/components/?page_size=100", None)["results"]
    for component in components:
        if component.get("layer") != "job_facing" and component.get("versions"):
            newest = component["versions"][-1]
            version = newest["version"] if isinstance(newest, dict) else str(newest)
            try:
                client.api(
                    "POST",
                    "/api/upgrades/",
                    {"pool": pool["id"], "component": component["name"], "version": version, "reason": "soak"},
                )
            except urllib.error.HTTPError:
                continue  # refused (already at target, incompatible): another component will do
            return


def _submit_reboots(client: _Client, hosts: list[dict], stop: threading.Event, submitted: list[int]) -> None:
    """A reboot of two hosts every few seconds: small, so many finish within a short soak."""
    chooser = random.Random(1)
    while not stop.wait(3):
        names = [host["hostname"] for host in chooser.sample(hosts, 2)]
        try:
            client.api("POST", "/api/operations/", {"kind": "reboot", "hosts": names, "reason": "soak reboot"})
            submitted[0] += 1
        except (urllib.error.HTTPError, OSError):
            continue


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait(condition: Callable[[], object], *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout:.0f} s")


def run(seconds: float | None) -> list[Figure]:
    seconds = seconds or DEFAULT_SECONDS
    result = soak(seconds, cpu_load=os.environ.get("BENCH_SOAK_CPU_LOAD", "1") == "1")
    how = f"python -m bench embedded_soak --seconds {seconds:g} (2,000 demo hosts, one core kept busy)"
    if result.page_errors:
        print(f"embedded_soak: failed pages: {result.page_errors[:10]}", file=sys.stderr)
    return [
        Figure("embedded_soak_crashes", result.crashes + (0 if result.serve_alive else 1), "crashes", how),
        Figure("embedded_soak_page_errors", len(result.page_errors), "pages", how),
        Figure("embedded_soak_operations_finished", result.operations_finished, "operations", how),
        Figure("embedded_soak_page_p50_ms", round(statistics.median(result.latencies_ms or [0]), 1), "ms", how),
        Figure("embedded_soak_page_p95_ms", round(result.percentile(0.95), 1), "ms", how),
        Figure("embedded_demo_first_visit_s", result.first_visit_running_s or -1, "s", how),
    ]

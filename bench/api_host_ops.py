"""Host operations per second through the HTTP API: every drain, execute, three checks and undrain
of every host operation is claimed and reported over HTTP by external adapter processes working
in batches (claim up to CLAIM_LIMIT with a short long poll, one batch heartbeat, batch reports of
up to 500), on 10,000 hosts, with two real Celery worker processes and the beat ticking the pools,
and the ASGI server of ASGI_SERVER (granian by default) with WEB_WORKERS processes. PostgreSQL's
own simple-update rate (pgbench) is measured in the same run, on the same server.

Target: at least 116 host-operations per second sustained for 5 minutes (ten times Meta's
published million a day); aim: 361 (the internal path, host_ops_per_s).

The adapters' work takes no time (as in host_ops): the figure is the orchestrator plus the API.
Run as `python -m bench.api_host_ops adapter …` it is one adapter process (what `run` starts).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import ROOT, Figure, load_average, start_web_server, stop_process
from bench.host_ops import BusyDomains

POOLS = 4
HOSTS_PER_POOL = 2_500
HOSTS_PER_DOMAIN = 25
DEFAULT_SECONDS = 300.0
WARM_UP_SECONDS = 20.0
# Web processes: two per core measured best for the API (see BENCHMARKS.md).
WEB_WORKERS = int(os.environ.get("BENCH_WEB_WORKERS", str(2 * (os.cpu_count() or 1))))
# (name, kinds): drainers (drains and undrains) and executors (the work and the checks), several
# processes each (four items of a host operation are the executor's, two the drainer's). Each
# holds one keep-alive connection, which stays with one web process: eight spread over them.
ADAPTERS = [(f"drainer-{i}", ["drain", "undrain"]) for i in (1, 2, 3)]
ADAPTERS += [(f"executor-{i}", ["execute", "verify"]) for i in (1, 2, 3, 4, 5)]
CLAIM_LIMIT = 500  # the batch report's maximum, so one claim is one report
CLAIM_WAIT_S = 2
LEASE_S = 300


def run(seconds: float | None = None) -> list[Figure]:
    seconds = seconds or DEFAULT_SECONDS
    from bench.host_ops import _check_the_outcome, _start_workers_and_beat, pgbench_simple_update_tps
    from bench.setup import django_on_scratch_database

    url = django_on_scratch_database("bench_api_ops")
    busy, token = _seed()
    web = start_web_server(url, workers=WEB_WORKERS, name="api-host-ops")
    processes = _start_workers_and_beat(url)
    # The first operations before the adapters start (400 submissions take most of a minute), and
    # the adapters run until told to stop: with a fixed end time they stopped before the measuring
    # did whenever the submissions ran long, which looked like a stalled orchestrator.
    busy.keep_busy()
    stop_file = _stop_file()
    adapters = [_start_adapter(web.port, token, name, kinds, stop_file) for name, kinds in ADAPTERS]
    try:
        rate, load = _measure(seconds, busy)
    finally:
        stop_file.touch()
        stats = [_adapter_stats(process) for process in adapters]
        for process in [*processes, web.process]:
            stop_process(process, timeout=30)
    refused = sum(stat["refused"] for stat in stats)
    if refused:
        raise SystemExit(f"the API refused {refused} heartbeats or reports of the adapters' own claims")
    _check_the_outcome()
    tps = pgbench_simple_update_tps()
    print(f"bench api_host_ops: adapters {stats}", file=sys.stderr, flush=True)
    how = (
        f"ASGI_SERVER={web.server} python -m bench api_host_ops --seconds {seconds:g} ({web.server}, "
        f"{WEB_WORKERS if web.server != 'daphne' else 1} web processes, 2 worker processes + beat, "
        f"{POOLS * HOSTS_PER_POOL:,} hosts, {len(ADAPTERS)} external adapter processes claiming up to "
        f"{CLAIM_LIMIT} and reporting in batches over HTTP, zero-duration work, full lifecycle per host task; "
        f"{load})"
    )
    return [
        Figure("api_host_ops_per_s", round(rate, 1), "ops/s", how),
        Figure("pgbench_tps", round(tps), "tps", "pgbench -b simple-update -c 2 -j 2 -T 30, scale 10, same run"),
    ]


def _seed() -> tuple[BusyDomains, str]:
    """The fleet (its pools' adapters external), one open operation per domain, an executor's token."""
    from django.contrib.auth import get_user_model
    from knox.models import AuthToken

    from bench.fleet import bench_fleet
    from fleet.models import Pool
    from opsplanner.models import Adapter
    from opsplanner.roles import Role, roles_ensure

    pools = bench_fleet(
        pools=POOLS, hosts_per_pool=HOSTS_PER_POOL, hosts_per_domain=HOSTS_PER_DOMAIN, planned_fraction="0.20"
    )
    Pool.objects.filter(pk__in=[p.pk for p in pools]).update(drainer=Adapter.EXTERNAL, executor=Adapter.EXTERNAL)
    scopes = [f"domain {pool.name}/{name}" for pool in pools for name in pool.domains.values_list("name", flat=True)]
    user = get_user_model().objects.create_user(username="bench-adapter", password=uuid.uuid4().hex)
    user.groups.add(roles_ensure()[Role.EXECUTOR])
    return external_busy_domains(scopes), AuthToken.objects.create(user)[1]


def external_busy_domains(scopes: list[str]) -> BusyDomains:
    """One open reboot operation per domain, drained and run by the external adapters."""
    from opsplanner.models import Adapter

    return BusyDomains(scopes, reason="api benchmark", executor=Adapter.EXTERNAL, drainer=Adapter.EXTERNAL)


def _measure(seconds: float, busy: BusyDomains) -> tuple[float, str]:
    """Host tasks finished per second over `seconds` after the warm-up, and the load meanwhile."""
    from bench.host_ops import _finished

    busy.keep_busy()
    started = time.monotonic()
    while time.monotonic() - started < WARM_UP_SECONDS:
        busy.keep_busy()
        time.sleep(1)
    first, measured_from = _finished(), time.monotonic()
    loads: list[str] = []
    while time.monotonic() - measured_from < seconds:
        busy.keep_busy()
        time.sleep(1)
        loads.append(load_average())
        print(
            f"bench api_host_ops: {_finished() - first:,} host-operations in "
            f"{time.monotonic() - measured_from:.0f} s ({loads[-1]})",
            file=sys.stderr,
            flush=True,
        )
    elapsed = time.monotonic() - measured_from
    return (_finished() - first) / elapsed, loads[len(loads) // 2] if loads else load_average()


def _logs() -> Path:
    logs = Path(os.environ.get("OPSPLANNER_VAR_DIR", ROOT / "var")) / "bench"
    logs.mkdir(parents=True, exist_ok=True)
    return logs


def _stop_file() -> Path:
    """A file whose existence tells the adapter processes to finish their batch and stop."""
    path = _logs() / f"api-adapters-stop-{uuid.uuid4().hex[:8]}"
    path.unlink(missing_ok=True)
    return path


def _start_adapter(port: int, token: str, name: str, kinds: list[str], stop_file: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "bench.api_host_ops", "adapter", str(port), name, ",".join(kinds), str(stop_file)]
    logs = _logs()
    with (logs / f"api-adapter-{name}.log").open("w") as log:
        env = dict(os.environ, BENCH_ADAPTER_TOKEN=token)  # not on the command line
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)


def _adapter_stats(process: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    if process.returncode != 0 or not out.strip():
        raise SystemExit(f"an adapter process failed (exit {process.returncode}); see var/bench/api-adapter-*.log")
    return dict(json.loads(out.strip().splitlines()[-1]))


# --- One adapter process: stdlib http.client, one keep-alive connection ---------------------------


@dataclass
class JsonClient:
    port: int
    token: str
    connection: http.client.HTTPConnection = field(init=False)

    def __post_init__(self) -> None:
        self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

    seconds: dict[str, float] = field(default_factory=dict)  # time spent per path, for the report

    def post(self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
        started = time.perf_counter()
        payload = json.dumps(body).encode()
        sent = {"Authorization": f"Token {self.token}", "Content-Type": "application/json", **(headers or {})}
        sent["Accept"] = "application/json"
        self.connection.request("POST", path, payload, sent)
        response = self.connection.getresponse()
        data = response.read()
        if not 200 <= response.status < 300:
            raise SystemExit(f"POST {path}: HTTP {response.status}: {data[:500]!r}")
        self.seconds[path] = self.seconds.get(path, 0.0) + time.perf_counter() - started
        return json.loads(data)


def _result(item: dict[str, Any]) -> dict[str, Any]:
    """What a real adapter reports: a check passed; an upgrade's new version; else nothing."""
    if item["kind"] == "verify":
        return {"passed": True}
    component = (item.get("params") or {}).get("component")
    if item["kind"] == "execute" and component:
        return {"versions": {component: item["params"].get("version", "")}}
    return {}


def adapter_main(port: int, name: str, kinds: list[str], stop_file: Path) -> dict[str, Any]:
    """Claim (long poll), heartbeat the batch, report it done in one request; until stop_file exists."""
    client = JsonClient(port, os.environ["BENCH_ADAPTER_TOKEN"])
    stats: dict[str, Any] = {"name": name, "reported": 0, "requests": 0, "refused": 0, "max_batch": 0}
    while not stop_file.exists():
        claim = {"kinds": kinds, "limit": CLAIM_LIMIT, "lease_seconds": LEASE_S, "wait_seconds": CLAIM_WAIT_S}
        items = client.post("/api/work-items/claim/", {**claim, "worker": name})
        stats["requests"] += 1
        if not items:
            continue
        attempts = [{"id": item["id"], "attempt": item["attempt"]} for item in items]
        beats = client.post("/api/work-items/heartbeat/", {"items": attempts, "lease_seconds": LEASE_S, "worker": name})
        reports = [
            {"id": item["id"], "attempt": item["attempt"], "outcome": "done", "result": _result(item)} for item in items
        ]
        answer = client.post(
            "/api/work-items/report/", {"reports": reports, "worker": name}, {"Idempotency-Key": uuid.uuid4().hex}
        )
        stats["requests"] += 2
        stats["refused"] += sum(row["status"] != "extended" for row in beats["results"])
        stats["refused"] += sum(row["status"] != "accepted" for row in answer["results"])
        stats["reported"] += len(items)
        stats["max_batch"] = max(stats["max_batch"], len(items))
    stats["seconds"] = {path.split("/")[-2]: round(spent, 1) for path, spent in client.seconds.items()}
    return stats


def _adapter_cli() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.api_host_ops adapter")
    parser.add_argument("mode", choices=["adapter"])
    parser.add_argument("port", type=int)
    parser.add_argument("name")
    parser.add_argument("kinds")
    parser.add_argument("stop_file", type=Path)
    args = parser.parse_args()
    print(json.dumps(adapter_main(args.port, args.name, args.kinds.split(","), args.stop_file)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_adapter_cli())

"""`make run`'s command, end to end, in the embedded default: SQLite, the SQLite broker, no servers.

It migrates, seeds, prints the logins last, serves the fleet page, runs a worker and the beat (the
heartbeat the beat schedules keeps arriving), keeps Celery's lines in var/log/, restarts a worker
killed with kill -9, and Ctrl-C stops all of it.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.processes import ROOT, free_port, wait_for

pytestmark = pytest.mark.slow


def _get(opener: urllib.request.OpenerDirector, url: str) -> tuple[int, str]:
    try:
        with opener.open(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return 0, ""


SERVE = [sys.executable, "manage.py", "serve"]


def _child_pid(parent: int, role: str) -> int | None:
    """The pid of serve's child running `celery ... <role>` (Linux /proc)."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    for pid in children:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if b"celery" in command and role.encode() in command:
            return int(pid)
    return None


def test_serve_runs_the_web_server_a_worker_and_the_beat_until_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in {"DATABASE_URL", "REDIS_URL"}}
    env.update({"DEBUG": "1", "OPSPLANNER_VAR_DIR": str(tmp_path / "var"), "WORKER_HEARTBEAT_SECONDS": "1"})
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        serve = subprocess.Popen(
            # Without the lively demo: this test numbers its own operations.
            [*SERVE, "--port", str(port), "--demo-hosts", "60", "--concurrency", "1", "--no-demo-alive"],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    try:
        wait_for(
            lambda: _get(opener, f"{base}/healthz/workers")[0] == 200 or serve.poll() is not None,
            timeout=120,
            what="the web server and a live worker",
            interval=0.5,
        )
        assert serve.poll() is None, log.read_text()
        first_beat = json.loads(_get(opener, f"{base}/healthz/workers")[1])["newest_heartbeat"]
        wait_for(
            lambda: json.loads(_get(opener, f"{base}/healthz/workers")[1])["newest_heartbeat"] != first_beat,
            timeout=30,
            what="the beat to schedule another heartbeat",
            interval=0.5,
        )

        output = log.read_text()
        assert f"running in embedded (SQLite, SQLite broker) mode at http://127.0.0.1:{port}/" in output
        assert output.rstrip().splitlines()[-1].startswith("  login: executor")  # URL and logins come last
        assert "celery.app.trace" not in output  # per-task lines go to var/log/worker.log
        assert "celery.app.trace" in (tmp_path / "var" / "log" / "worker.log").read_text()
        password = re.search(r"login: operator\s+password: (\S+)", output).group(1)
        assert password == (tmp_path / "var" / "demo-credentials.txt").read_text().strip()

        status, login_page = _get(opener, f"{base}/login/")
        assert status == 200
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page).group(1)
        form = urllib.parse.urlencode(
            {"username": "operator", "password": password, "csrfmiddlewaretoken": token, "next": "/"}
        ).encode()
        request = urllib.request.Request(f"{base}/login/", data=form, headers={"Referer": f"{base}/login/"})
        with opener.open(request, timeout=10) as response:
            home = response.read().decode()
        for pool in ("ai-train-east", "ai-infer-west", "web-central", "storage-north"):
            assert f'id="pool-{pool}"' in home
        assert "In service: 24" in home  # 40% of 60 hosts in the training pool
        assert _get(opener, f"{base}/static/css/opsplanner.css")[0] == 200

        # The embedded worker and beat run real operations: a rack of the training pool gets a driver.
        instant = (
            "from opsplanner.models import SimulatorProfile as P; p = P.current(); "
            "p.drain_seconds = p.execute_seconds = p.verify_seconds = p.undrain_seconds = 0; p.save()"
        )
        manage = [sys.executable, "manage.py"]
        subprocess.run([*manage, "shell", "-c", instant], cwd=ROOT, env=env, check=True, timeout=60)
        submitted = subprocess.run(
            [
                *manage,
                "submit_operation",
                "--kind",
                "upgrade",
                "--component",
                "gpu-driver",
                "--target-version",
                "560.35.03",
                "--scope",
                "domain ai-train-east/rack-0001",
                "--reason",
                "rollout",
                "--wait",
                "--timeout",
                "90",
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert submitted.returncode == 0, (
            submitted.stdout + submitted.stderr + "\n--- serve log (tail) ---\n" + log.read_text()[-6000:]
        )
        assert "submitted operation #1 with 16 host tasks" in submitted.stdout
        assert "operation #1 completed" in submitted.stdout
        invariants = subprocess.run([*manage, "check_invariants"], cwd=ROOT, env=env, capture_output=True, text=True)
        assert invariants.returncode == 0, invariants.stderr
        refused = subprocess.run(
            [*manage, "submit_operation", "--kind", "reboot", "--scope", "pool nowhere", "--reason", "x"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 1
        assert "refused: There is no pool named 'nowhere'." in refused.stderr

        # A worker killed with kill -9 is restarted, said in one line, and work goes on.
        worker = _child_pid(serve.pid, "worker")
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: "worker exited with code -9" in log.read_text(), timeout=20, what="the restart message")
        wait_for(lambda: _child_pid(serve.pid, "worker") not in (None, worker), timeout=30, what="a new worker")
        again = subprocess.run(
            [*manage, "submit_operation", "--kind", "reboot", "--scope", "domain ai-train-east/rack-0001",
             "--reason", "after the restart", "--wait", "--timeout", "90"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert again.returncode == 0, again.stdout + again.stderr + log.read_text()[-3000:]
        assert "operation #2 completed" in again.stdout
        assert serve.poll() is None
    finally:
        serve.send_signal(signal.SIGINT)
        try:
            code = serve.wait(timeout=40)
        except subprocess.TimeoutExpired:
            serve.kill()
            raise
    assert code == 0, log.read_text()
    assert "OpsPlanner stopped." in log.read_text()
    time.sleep(0.5)
    assert _get(opener, f"{base}/healthz")[0] == 0  # nothing listens any more

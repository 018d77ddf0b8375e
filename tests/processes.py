"""Real processes for tests: Celery workers against the test database, and the embedded `serve`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def wait_for(condition: Callable[[], object], *, timeout: float, what: str, interval: float = 0.2) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_database_url() -> str:
    """The URL of the database pytest-django created, for processes that must share it."""
    db = connection.settings_dict
    credentials = quote(db["USER"] or "")
    if db["PASSWORD"]:
        credentials += ":" + quote(db["PASSWORD"])
    return f"postgresql://{credentials}@{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"


@dataclass
class WorkerProcess:
    name: str
    queue: str
    process: subprocess.Popen
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _process_env(tmp_path: Path, queue: str, tag: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    # Not a web process: once a test imported config.asgi, this process's environment says ASGI, and
    # a worker inheriting it would run on the web's connection pool (opened in full, and closed by
    # Celery around every task), which is not how a worker runs.
    env = {name: value for name, value in os.environ.items() if name != "OPSPLANNER_ASGI"}
    env.update(
        {
            "DATABASE_URL": test_database_url(),
            "CELERY_QUEUE": queue,
            "DEBUG": "1",
            "KICK_TASKS": "1",
            "OPSPLANNER_VAR_DIR": str(tmp_path / f"var-{tag}"),
        }
    )
    env.update(extra or {})
    return env


def start_worker(
    tmp_path: Path, *, concurrency: int = 1, queue: str | None = None, extra_env: dict[str, str] | None = None
) -> WorkerProcess:
    """A real Celery worker on its own queue (so runs never share messages), on the test database."""
    tag = uuid.uuid4().hex[:8]
    name = f"test-{tag}@{socket.gethostname()}"
    queue = queue or f"test-{tag}"
    env = _process_env(tmp_path, queue, tag, extra_env)
    log = tmp_path / f"worker-{tag}.log"
    command = [
        *(sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", queue, "-n", name),
        *("--concurrency", str(concurrency), "--loglevel", "INFO", "--without-mingle", "--without-gossip"),
    ]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    return WorkerProcess(name=name, queue=queue, process=process, log=log)


def start_beat(tmp_path: Path, *, queue: str, extra_env: dict[str, str] | None = None) -> WorkerProcess:
    """The real Celery beat, sending the periodic tick and simulator steps to `queue`."""
    tag = uuid.uuid4().hex[:8]
    env = _process_env(tmp_path, queue, tag, extra_env)
    log = tmp_path / f"beat-{tag}.log"
    command = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "config",
        "beat",
        "--loglevel",
        "INFO",
        "--schedule",
        str(tmp_path / f"beat-{tag}.schedule"),
    ]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    return WorkerProcess(name=f"beat-{tag}", queue=queue, process=process, log=log)

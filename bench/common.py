"""What every benchmark shares: figures, a scratch PostgreSQL database, running manage.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from config.env import parse_database_url

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    unit: str
    how: str  # how to reproduce, shown in BENCHMARKS.md

    def line(self) -> str:
        return f"{self.name}: {self.value:g} {self.unit}"


def scratch_database_url(name: str) -> str:
    """A freshly created, empty database on the server of DATABASE_URL, named after its database
    (opsplanner_bench_tick for …/opsplanner), so checkouts with their own databases never share one."""
    # The first URL seen is the base: a benchmark process later points DATABASE_URL at its scratch database.
    base = os.environ.setdefault("BENCH_BASE_DATABASE_URL", os.environ["DATABASE_URL"])
    config = parse_database_url("DATABASE_URL", base)
    if config.is_sqlite:
        raise SystemExit("benchmarks run on PostgreSQL: set DATABASE_URL=postgresql://…")
    name = f"{config.name}_{name}"
    with psycopg.connect(
        dbname="postgres",
        host=config.host,
        port=config.port or "5432",
        user=config.user,
        password=config.password,
        autocommit=True,
    ) as connection:
        connection.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    auth = config.user + (f":{config.password}" if config.password else "")
    return f"postgresql://{auth}@{config.host or 'localhost'}:{config.port or 5432}/{name}"


def manage(*args: str, database_url: str, check: bool = True) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run manage.py in a fresh process against database_url; return (wall seconds, result)."""
    env = dict(os.environ, DATABASE_URL=database_url, DEBUG="1")
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    elapsed = time.perf_counter() - started
    if check and result.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{result.stderr}")
    return elapsed, result


# --- The web server the API benchmarks run (settings.ASGI_SERVER's choice) ------------------------


@dataclass
class WebServer:
    server: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path


def asgi_server_name() -> str:
    """ASGI_SERVER as the settings read it (granian by default)."""
    return os.environ.get("ASGI_SERVER", "granian").strip().lower() or "granian"


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_web_server(database_url: str, *, workers: int, name: str, server: str | None = None) -> WebServer:
    """The ASGI server on a free port with `workers` processes (daphne: one), DEBUG off, the API's
    per-token limit lifted (a benchmark shares one token per role); returns once /healthz answers."""
    from opsplanner.management.commands.serve import asgi_server_command

    server = server or asgi_server_name()
    env = dict(
        os.environ,
        DATABASE_URL=database_url,
        DEBUG=os.environ.get("DEBUG", "0"),
        ALLOWED_HOSTS="127.0.0.1,localhost",
        API_THROTTLE_RATE="100000000/min",
        LOG_LEVEL="WARNING",
        ASGI_SERVER=server,
    )
    logs = Path(os.environ.get("OPSPLANNER_VAR_DIR", ROOT / "var")) / "bench"
    logs.mkdir(parents=True, exist_ok=True)
    port, log = free_port(), logs / f"{name}-{server}.log"
    command = asgi_server_command(server, host="127.0.0.1", port=port, workers=1 if server == "daphne" else workers)
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    web = WebServer(server, port, process, log)
    deadline = time.monotonic() + 60
    while not _healthz_answers(port):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_process(process)
            raise SystemExit(f"{server} on port {port} did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return web


def _healthz_answers(port: int) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return sock.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def stop_process(process: subprocess.Popen, timeout: float = 15) -> None:
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def load_average() -> str:
    """The machine's 1-minute load average and cores, for figures measured on a shared machine."""
    one, _, _ = os.getloadavg()
    return f"load {one:.1f} on {os.cpu_count()} cores"

"""python manage.py serve: the embedded default in one command (what `make run` calls).

Migrates, seeds a demo fleet when the database has no hosts, creates the demo logins, then runs the
ASGI web server (settings.ASGI_SERVER: granian by default, uvicorn or daphne), a Celery worker and
the Celery beat, supervised (config/supervisor.py): a child that dies is restarted after a
back-off with a one-line message; only repeated crashes stop the product (exit non-zero). Each child
logs to var/log/<name>.log; Ctrl-C stops all three.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from config.supervisor import ChildSpec, Supervisor, TooManyCrashes
from opsplanner.demo_users import demo_users_ensure
from opsplanner.services.work_items import MAX_WAITERS

POLL_SECONDS = 0.5
# Web processes per core with PostgreSQL and Redis (measured: see BENCHMARKS.md, api_*). The
# embedded mode runs one: SQLite takes one writer at a time and its channel layer is in-process.
WEB_WORKERS_PER_CORE = 2
# granian: requests a worker admits besides the long-polling claims (those doing work wait for one of
# the process's database connections anyway), and the listen queue of new connections (agents
# reconnecting after their work).
BUSY_REQUESTS_PER_WORKER = 256
LISTEN_BACKLOG = 4096


class Command(BaseCommand):
    help = "Run the web server, a worker and the periodic scheduler together, supervised (the embedded default)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--demo-hosts", type=int, default=2000, help="hosts to seed when the fleet is empty")
        parser.add_argument("--concurrency", type=int, default=2, help="worker processes")
        parser.add_argument(
            "--web-workers",
            type=int,
            default=None,
            help=f"web server processes (default: {WEB_WORKERS_PER_CORE} per core with PostgreSQL/Redis, "
            "1 embedded; daphne always runs 1)",
        )
        parser.add_argument(
            "--no-demo-alive",
            dest="demo_alive",
            action="store_false",
            help="in DEBUG, leave a fleet without trains still (by default serve puts the demo in motion)",
        )

    def handle(
        self,
        *args: object,
        host: str,
        port: int,
        demo_hosts: int,
        concurrency: int,
        demo_alive: bool,
        web_workers: int | None = None,
        **opts: object,
    ) -> None:
        if not 1 <= port <= 65535:
            raise CommandError(f"--port must be between 1 and 65535, not {port}")
        if web_workers is not None and web_workers < 1:
            raise CommandError(f"--web-workers must be at least 1, not {web_workers}")
        port_free_or_refuse(host, port)
        call_command("migrate", interactive=False, verbosity=0)
        call_command("seed_demo", hosts=demo_hosts, if_empty=True, stdout=self.stdout, stderr=self.stderr)
        logins = demo_users_ensure() if settings.DEBUG else []
        if settings.DEBUG and demo_alive:
            call_command("demo_alive", stdout=self.stdout, stderr=self.stderr)

        web = web_workers or default_web_workers()
        supervisor = Supervisor(_children(host=host, port=port, concurrency=concurrency, web=web), say=self._say)
        stopping = False

        def request_stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        # Before any child starts: the children run in their own sessions (Ctrl-C reaches serve
        # alone), so serve dying on a signal would leave them running with nobody to stop them.
        # SIGHUP is the terminal of `make run` being closed.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, request_stop)
        try:
            supervisor.start_all()
            self._banner(host=host, port=port, logins=logins, web=web)
            while not stopping:
                supervisor.check()
                time.sleep(POLL_SECONDS)
        except TooManyCrashes as crashes:
            raise CommandError(f"stopped because the {crashes}") from None
        finally:
            supervisor.stop_all()  # whatever ended the loop (even a write to a closed terminal)
            _kill_leftovers(supervisor)
        self.stdout.write("OpsPlanner stopped.")

    def _say(self, line: str) -> None:
        self.stderr.write(line)
        self.stderr.flush()

    def _banner(self, *, host: str, port: int, logins: list, web: int = 1) -> None:
        mode = "embedded (SQLite, SQLite broker)" if settings.REDIS_URL is None else "PostgreSQL/Redis"
        log_dir = settings.VAR_DIR / "log"
        self.stdout.write(f"\nLogs of the web server, the worker and the scheduler: {log_dir}/")
        self.stdout.write("Press Ctrl-C to stop the web server, the worker and the scheduler.")
        self.stdout.write(f"Web server: {settings.ASGI_SERVER}, {web} process{'es' if web > 1 else ''}.")
        self.stdout.write(f"OpsPlanner is running in {mode} mode at http://{host}:{port}/")
        for login in logins:
            self.stdout.write(f"  login: {login.username:<10} password: {login.password}   ({login.role})")
        self.stdout.flush()


def port_free_or_refuse(host: str, port: int) -> None:
    """Refuse a port something already listens on, before anything is migrated or started.

    granian binds with SO_REUSEPORT, so its own bind never fails on a busy port: a second `serve`
    there (another data dir, or the orphans of a killed one) would share the port and the kernel
    would split the browsers' connections between the two instances. A plain bind does fail."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # A connection of a previous run still in TIME_WAIT does not hold the port; a listener does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise CommandError(
                    f"{host}:{port} is already in use: is OpsPlanner already running there? "
                    "Stop it, or choose another --port."
                ) from None
            raise CommandError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None


def _kill_leftovers(supervisor: Supervisor) -> None:
    """Kill what is left in the children's process groups once they stopped. Each child leads its
    own session, and a grandchild can outlive it: granian stopped while its worker still imports
    the application waits for it, is killed after the grace period, and the worker went on holding
    the port with nobody to stop it."""
    for child in supervisor.children:
        if child.process is None:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):  # an empty group: nothing was left
            os.killpg(child.process.pid, signal.SIGKILL)


def default_web_workers() -> int:
    if settings.REDIS_URL is None or settings.ASGI_SERVER == "daphne":
        return 1
    return WEB_WORKERS_PER_CORE * (os.cpu_count() or 1)


def asgi_server_command(server: str, *, host: str, port: int, workers: int = 1) -> list[str]:
    """The command line that serves config.asgi:application with `server` (settings.ASGI_SERVER's
    values). uvicorn and granian fork `workers` processes on one socket; daphne has no workers."""
    app, python = "config.asgi:application", sys.executable
    if server == "uvicorn":
        # Django's handler has no lifespan; uvloop and httptools are the fast loop and parser. Idle
        # keep-alive connections live 75 s (uvicorn's 5 s closed agents' connections between their
        # steps), longer than a load balancer's usual 60 s, so the balancer closes first.
        return [python, "-m", "uvicorn", app, "--host", host, "--port", str(port), "--workers", str(workers),
                "--loop", "uvloop", "--http", "httptools", "--ws", "websockets", "--lifespan", "off",
                "--no-access-log", "--timeout-keep-alive", "75", "--timeout-graceful-shutdown", "5"]  # fmt: skip
    if server == "granian":
        # asginl: ASGI without lifespan. granian admits backlog/workers requests at once per worker by
        # default (256 with 4): long-polling claims filled that and every other request queued behind
        # them for seconds. Admit every waiter the process allows and the requests doing work.
        backpressure = MAX_WAITERS + BUSY_REQUESTS_PER_WORKER
        return [python, "-m", "granian", "--interface", "asginl", "--host", host, "--port", str(port),
                "--workers", str(workers), "--loop", "uvloop", "--no-access-log",
                "--backlog", str(LISTEN_BACKLOG), "--backpressure", str(backpressure), app]  # fmt: skip
    if server == "daphne":
        return [python, "-m", "daphne", "-b", host, "-p", str(port), app]
    raise CommandError(f"unknown ASGI server {server!r}: uvicorn, daphne or granian")


def _web_command(host: str, port: int, web: int) -> Sequence[str]:
    return asgi_server_command(settings.ASGI_SERVER, host=host, port=port, workers=web)


def _children(*, host: str, port: int, concurrency: int, web: int = 1) -> list[ChildSpec]:
    python = sys.executable
    log_dir = settings.VAR_DIR / "log"
    embedded = settings.REDIS_URL is None
    # The embedded broker has no fanout: no gossip, mingle or remote control between workers.
    solo_flags = ["--without-gossip", "--without-mingle"] if embedded else []
    return [
        ChildSpec("web", _web_command(host, port, web), log_dir / "web.log"),
        ChildSpec("worker", [python, "-m", "celery", "-A", "config", "worker", "--loglevel", "INFO",
                             "--concurrency", str(concurrency), "-n", "worker@%h", *solo_flags],
                  log_dir / "worker.log"),
        ChildSpec("beat", [python, "-m", "celery", "-A", "config", "beat", "--loglevel", "INFO",
                           "--schedule", settings.CELERY_BEAT_SCHEDULE_FILENAME],
                  log_dir / "beat.log"),
    ]  # fmt: skip

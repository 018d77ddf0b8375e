"""python manage.py serve: the embedded default in one command (what `make run` calls).

Migrates, seeds a demo fleet when the database has no hosts, creates the demo logins, then runs the
ASGI web server (daphne), a Celery worker and the Celery beat in the foreground. Ctrl-C stops all
three; if one of them dies, the others are stopped too and the command exits non-zero.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from opsplanner.demo_users import demo_users_ensure

STOP_GRACE_SECONDS = 10


class Command(BaseCommand):
    help = "Run the web server, a worker and the periodic scheduler together (the embedded default)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--demo-hosts", type=int, default=2000, help="hosts to seed when the fleet is empty")
        parser.add_argument("--concurrency", type=int, default=2, help="worker processes")

    def handle(self, *args: object, host: str, port: int, demo_hosts: int, concurrency: int, **opts: object) -> None:
        if not 1 <= port <= 65535:
            raise CommandError(f"--port must be between 1 and 65535, not {port}")
        call_command("migrate", interactive=False, verbosity=0)
        call_command("seed_demo", hosts=demo_hosts, if_empty=True, stdout=self.stdout, stderr=self.stderr)
        logins = demo_users_ensure() if settings.DEBUG else []

        python = sys.executable
        commands = {
            "web": [python, "-m", "daphne", "-b", host, "-p", str(port), "opsplanner.asgi:application"],
            "worker": [
                python, "-m", "celery", "-A", "opsplanner", "worker", "--loglevel", "INFO",
                "--concurrency", str(concurrency), "-n", "worker@%h",
            ],
            "beat": [python, "-m", "celery", "-A", "opsplanner", "beat", "--loglevel", "INFO",
                     "--schedule", settings.CELERY_BEAT_SCHEDULE_FILENAME],
        }  # fmt: skip
        children = {name: subprocess.Popen(command, env=os.environ.copy()) for name, command in commands.items()}

        mode = "embedded (SQLite, filesystem broker)" if settings.REDIS_URL is None else "PostgreSQL/Redis"
        self.stdout.write(f"\nOpsPlanner is running in {mode} mode at http://{host}:{port}/")
        for login in logins:
            self.stdout.write(f"  login: {login.username:<10} password: {login.password}   ({login.role})")
        self.stdout.write("Press Ctrl-C to stop the web server, the worker and the scheduler.\n")
        self.stdout.flush()

        stopping = False

        def request_stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
        failed = ""
        while not stopping:
            for name, child in children.items():
                if child.poll() is not None:
                    failed = f"{name} exited with code {child.returncode}"
                    stopping = True
                    break
            time.sleep(0.5)
        _stop_all(children)
        if failed:
            raise CommandError(f"stopped because the {failed}")
        self.stdout.write("OpsPlanner stopped.")


def _stop_all(children: dict[str, subprocess.Popen]) -> None:
    for child in children.values():
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for child in children.values():
        try:
            child.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

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

from opsplanner.env import parse_database_url

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

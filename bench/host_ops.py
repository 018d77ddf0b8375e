"""End-to-end host-operations per second: every host task goes through admission, a drain, its
work, three verifications and the return to service, driven by two real Celery worker processes
and the beat on PostgreSQL and Redis, with zero-duration simulated drains and executors.
PostgreSQL's own simple-update rate (pgbench) is measured in the same run, on the same server.

Target: at least 116 host-operations per second sustained for 5 minutes (10 million a day);
aim: 1,160.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench.common import ROOT, Figure, scratch_database_url

POOLS = 4
HOSTS_PER_POOL = 2_500
DEFAULT_SECONDS = 300.0
WARM_UP_SECONDS = 20.0


def run(seconds: float | None = None) -> list[Figure]:
    seconds = seconds or DEFAULT_SECONDS
    from bench.setup import django_on_scratch_database

    url = django_on_scratch_database("bench_ops")
    from bench.fleet import bench_fleet
    from opsplanner.services.simulator import simulator_profile_instant

    pools = bench_fleet(pools=POOLS, hosts_per_pool=HOSTS_PER_POOL, hosts_per_domain=25, planned_fraction="0.20")
    # Each domain always has one open operation, so hosts never wait for each other's operations
    # (no handover shortcut): every host task takes the whole lifecycle.
    busy = BusyDomains(
        [f"domain {pool.name}/{name}" for pool in pools for name in pool.domains.values_list("name", flat=True)]
    )
    simulator_profile_instant(batch_size=2_000)
    processes = _start_workers_and_beat(url)
    try:
        rate = _measure(seconds, busy)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
    _check_the_outcome()
    tps = pgbench_simple_update_tps()
    how = (
        f"python -m bench host_ops --seconds {seconds:g} (2 worker processes + beat, {POOLS * HOSTS_PER_POOL:,} "
        "hosts, zero-duration simulated drains and executors, full lifecycle per host task)"
    )
    return [
        Figure("host_ops_per_s", round(rate, 1), "ops/s", how),
        Figure("pgbench_tps", round(tps), "tps", "pgbench -b simple-update -c 2 -j 2 -T 30, scale 10, same run"),
    ]


class BusyDomains:
    """Keeps one open reboot operation per scope (a domain), submitting a new one when it closes;
    `executor` and `drainer` for the operations, empty for the pools' (the simulated ones)."""

    def __init__(self, scopes: list[str], *, reason: str = "benchmark", executor: str = "", drainer: str = "") -> None:
        self.scopes = scopes
        self.reason = reason
        self.executor, self.drainer = executor, drainer
        self.open_operations: dict[str, int] = {}

    def keep_busy(self) -> None:
        from opsplanner.models import Operation, OperationState
        from opsplanner.services.operations import operation_submit

        still_open = set(
            Operation.objects.filter(pk__in=self.open_operations.values(), state=OperationState.OPEN).values_list(
                "id", flat=True
            )
        )
        for scope in self.scopes:
            if self.open_operations.get(scope) not in still_open:
                operation = operation_submit(
                    kind="reboot", scope=scope, reason=self.reason, executor=self.executor, drainer=self.drainer
                )
                self.open_operations[scope] = operation.pk


def _start_workers_and_beat(url: str) -> list[subprocess.Popen]:
    """Two single-process workers and the beat on a queue of their own, ticking every second."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, DATABASE_URL=url, CELERY_QUEUE=queue, KICK_TASKS="1", TICK_SECONDS="1")
    logs = Path(os.environ.get("OPSPLANNER_VAR_DIR", ROOT / "var")) / "bench"
    logs.mkdir(parents=True, exist_ok=True)
    workers = [
        _start(
            [
                "worker",
                "-Q",
                queue,
                "-n",
                f"bench-{i}@%h",
                "--concurrency",
                "1",
                "--without-gossip",
                "--without-mingle",
            ],
            env,
            logs / f"worker-{i}.log",
        )
        for i in (1, 2)
    ]
    return [*workers, _start(["beat", "--schedule", str(logs / f"beat-{queue}")], env, logs / "beat.log")]


def _finished() -> int:
    from opsplanner.models import HostTask, TaskState

    return HostTask.objects.filter(state__in=[TaskState.DONE, TaskState.HANDED_OVER]).count()


def _measure(seconds: float, busy: BusyDomains) -> float:
    """Host tasks finished per second over `seconds`, after WARM_UP_SECONDS, every domain kept busy."""
    busy.keep_busy()
    started = time.monotonic()
    while time.monotonic() - started < WARM_UP_SECONDS:
        busy.keep_busy()
        time.sleep(1)
    first, measured_from = _finished(), time.monotonic()
    while time.monotonic() - measured_from < seconds:
        busy.keep_busy()
        time.sleep(1)
        done = _finished() - first
        print(
            f"bench host_ops: {done:,} host-operations in {time.monotonic() - measured_from:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    elapsed = time.monotonic() - measured_from
    return (_finished() - first) / elapsed


def _check_the_outcome() -> None:
    """No invariant broken and no host task failed: a fast run that breaks them measures nothing."""
    from django.db import connection

    from opsplanner.models import HostTask, TaskState
    from opsplanner.selectors.invariants import check_invariants

    with connection.cursor() as cursor:
        # What autovacuum would have done by now (it is off on this machine's PostgreSQL): without
        # statistics the invariant check's anti-joins over millions of events are planned as
        # nested loops and ran for over 9 minutes.
        cursor.execute("ANALYZE")
    violations = check_invariants()
    if violations:
        raise SystemExit(f"invariant violations after the benchmark: {violations[:5]}")
    failed = HostTask.objects.filter(state=TaskState.FAILED).count()
    if failed:
        raise SystemExit(f"{failed} host tasks failed during the benchmark")


def _start(arguments: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("wb") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", *arguments, "--loglevel", "WARNING"],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )


def pgbench_simple_update_tps() -> float:
    url = scratch_database_url("bench_pgbench")
    subprocess.run(["pgbench", "-i", "-q", "-s", "10", url], check=True, capture_output=True)
    result = subprocess.run(
        ["pgbench", "-b", "simple-update", "-c", "2", "-j", "2", "-T", "30", url],
        check=True,
        capture_output=True,
        text=True,
    )
    match = re.search(r"tps = ([0-9.]+)", result.stdout)
    if match is None:
        raise SystemExit(f"cannot read pgbench's output:\n{result.stdout}")
    return float(match.group(1))

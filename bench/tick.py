"""Scheduler ticks over 100,000 hosts in 20 pools, each pool with a pool-wide operation pending
and 5% of its hosts (its planned buffer) in flight. Runs in a child process so its peak memory
is its own. Figures:

- tick_100k_s: a steady tick at the aimed rate: 1,160 work items finished since the last tick
  (1,160 host-operations a second, ten times the target rate) to advance, plus admission in
  every pool. Target: under 1 s and under 1 GiB.
- tick_100k_idle_s: a tick with nothing finished (admission re-examines each pool's queue).
- tick_100k_cold_s: the first tick after the operations were submitted: it admits 5,000 hosts
  and records why the head of each queue waits.
- tick_100k_burst_s: every in-flight drain finished at once (5,000 transitions in one tick).

Each figure is the wall time of fleet_tick() as production runs it: pools ticked in its default
lanes (TICK_LANES, each lane on its own connection, opened and closed within the tick). The whole
sequence runs RUNS times (BENCH_TICK_RUNS, default 5), each on a freshly built fleet in a fresh
process; each figure is the median of the runs, and the cold and burst ticks also give their worst
run (`_max_s`): on a shared 2-core VM one run of the same code varies by a third either way.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from bench.common import ROOT, Figure

POOLS = 20
HOSTS_PER_POOL = 5_000
STEADY_ITEMS = 1_160


def run(seconds: float | None = None) -> list[Figure]:
    runs = int(os.environ.get("BENCH_TICK_RUNS", "5"))
    if runs < 1:
        raise SystemExit(f"BENCH_TICK_RUNS must be at least 1, not {runs}")
    results = [_one_run(number, runs) for number in range(1, runs + 1)]

    def median(key: str) -> float:
        return round(statistics.median(result[key] for result in results), 3)

    def worst(key: str) -> float:
        return max(result[key] for result in results)

    how = (
        "python -m bench tick (100,000 hosts, 20 pools, a pool-wide operation and 5% in flight per pool; "
        f"median of {runs} runs, each on a fresh fleet)"
    )
    return [
        Figure("tick_100k_s", median("steady"), "s", how + f"; steady tick advancing {STEADY_ITEMS:,} finished items"),
        Figure("tick_100k_idle_s", median("idle"), "s", how + "; tick with nothing finished"),
        Figure("tick_100k_cold_s", median("cold"), "s", how + "; first tick, admitting 5,000 hosts"),
        Figure("tick_100k_cold_max_s", worst("cold"), "s", how + "; first tick, the slowest of the runs"),
        Figure("tick_100k_burst_s", median("burst"), "s", how + "; all 5,000 in-flight drains finished at once"),
        Figure("tick_100k_burst_max_s", worst("burst"), "s", how + "; burst tick, the slowest of the runs"),
        Figure("tick_100k_rss_mib", worst("rss_mib"), "MiB", how + "; peak resident memory of the process, worst run"),
    ]


def _one_run(number: int, runs: int) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, "-m", "bench.tick", "--child"],
        cwd=ROOT,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"tick benchmark failed (run {number} of {runs}):\n{result.stderr}")
    figures: dict[str, float] = json.loads(result.stdout.strip().splitlines()[-1])
    print(f"bench: tick run {number} of {runs}: {figures}", file=sys.stderr, flush=True)
    return figures


def _timed_tick() -> float:
    import time

    from opsplanner.services.tick import fleet_tick

    started = time.perf_counter()
    reports = fleet_tick(time_budget_s=120)
    elapsed = time.perf_counter() - started
    assert len(reports) == POOLS, reports
    assert not any(r.skipped or r.retried for r in reports), reports
    return round(elapsed, 3)


def _warm_like_a_worker() -> None:
    """The tick runs in a Celery worker that has published before: its broker connection is open.
    This process has not, and its first publish (the tick's simulator kick) would add ~0.2 s of
    connecting and declaring to whichever tick comes first. Publish once beforehand, as a worker
    would have (no worker runs here: the message, like the ticks' kicks, stays queued)."""
    from django.conf import settings

    if settings.KICK_TASKS:
        from opsplanner.tasks import simulated_work_step

        simulated_work_step.delay()


def child() -> None:
    import resource

    from bench.setup import django_on_scratch_database

    django_on_scratch_database("bench_tick")
    from django.db import connection

    from bench.fleet import bench_fleet
    from opsplanner.models import HostTask, TaskState
    from opsplanner.services.operations import operation_submit
    from opsplanner.services.simulator import simulated_work_step, simulator_profile_instant

    pools = bench_fleet(pools=POOLS, hosts_per_pool=HOSTS_PER_POOL, hosts_per_domain=50, planned_fraction="0.05")
    for pool in pools:
        operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="benchmark")
    simulator_profile_instant(batch_size=100_000)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")  # what autovacuum does on a live database after a bulk load
        cursor.execute("CHECKPOINT")  # and the bulk load long written out, not flushed during the ticks
    _warm_like_a_worker()
    figures = {"cold": _timed_tick()}
    figures["idle"] = _timed_tick()
    simulated_work_step(limit=STEADY_ITEMS)  # claims every drain, finishes 1,160 of them
    figures["steady"] = _timed_tick()
    simulated_work_step()  # the remaining drains finish together
    figures["burst"] = _timed_tick()
    in_flight = HostTask.objects.filter(state__in=[TaskState.RUNNING, TaskState.VERIFYING]).count()
    assert in_flight == POOLS * HOSTS_PER_POOL * 5 // 100, in_flight
    figures["rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print(json.dumps(figures))


if __name__ == "__main__" and "--child" in sys.argv:
    child()

"""Seeding the demo fleet at 100,000 hosts on PostgreSQL (target: under 60 s), and the no-op rerun."""

from __future__ import annotations

from bench.common import Figure, manage, scratch_database_url

HOSTS = 100_000


def run(seconds: float | None = None) -> list[Figure]:
    url = scratch_database_url("bench_seed")
    manage("migrate", "-v0", database_url=url)
    first, _ = manage("seed_demo", "--hosts", str(HOSTS), database_url=url)
    again, result = manage("seed_demo", "--hosts", str(HOSTS), database_url=url)
    if "nothing to do" not in result.stdout:
        raise SystemExit(f"the second seed_demo run changed something:\n{result.stdout}")
    how = "python -m bench seed (fresh database, seed_demo --hosts 100000 in its own process, wall time)"
    return [
        Figure("seed_100k_s", round(first, 1), "s", how),
        Figure("seed_100k_rerun_s", round(again, 1), "s", how + "; second run, which changes nothing"),
    ]

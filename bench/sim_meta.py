"""The simulator in the many-upgrades regime (`--scenario meta`): wall time of the trains, and their
rollout measures, at a size that fits the time given.

python -m bench sim_meta [--seconds N]: without --seconds, the target of issue 24: 10,000 hosts in 10
pools over 30 days (under 10 minutes for the trains); with --seconds, a smaller fleet over fewer days
sized to take about that long (1,000 hosts in one pool, N / 10 days, from one to 30). Wall times
include creating the scratch databases.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import Figure, manage, scratch_database_url
from config.env import settings_or_exit

FULL = {"hosts": 10_000, "pools": 10, "days": 30.0}


def _size(seconds: float | None) -> dict[str, Any]:
    if seconds is None:
        return dict(FULL)
    # About 10 s of wall time per simulated day of 1,000 hosts (measured: 7 days in 42-90 s on a busy machine).
    return {"hosts": 1_000, "pools": 1, "days": min(30.0, max(1.0, round(seconds / 10, 1)))}


def _arguments(size: dict[str, Any], out: Path) -> list[str]:
    return [
        "simulate", "--scenario", "meta", "--hosts", str(size["hosts"]), "--pools", str(size["pools"]),
        "--days", f"{size['days']:g}", "--policies", "trains", "--lanes", "2", "--out", str(out), "--seed", "1",
    ]  # fmt: skip


def run(seconds: float | None = None) -> list[Figure]:
    size = _size(seconds)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    settings_or_exit()  # a configuration it refuses stops the benchmark in one line before the run, not after it
    django.setup()
    url = scratch_database_url("bench_sim_meta")  # the simulate command makes its scratch lanes next to it
    manage("migrate", "-v0", database_url=url)
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "meta"
        wall_s, _ = manage(*_arguments(size, out), database_url=url)
        runs = json.loads((out / "runs.json").read_text())
    label = f"{size['hosts'] // 1000}k_{size['days']:g}d"
    print(f"bench sim_meta: trains, {label}, took {wall_s:.0f} s", file=sys.stderr, flush=True)
    how = (
        f"python -m bench sim_meta: manage.py simulate --scenario meta --hosts {size['hosts']} --pools "
        f"{size['pools']} --days {size['days']:g} --policies trains --lanes 2 (wall time, scratch databases included)"
    )
    figures = [Figure(f"sim_meta_{label}_trains_s", round(wall_s, 1), "s", how)]
    measures = _measures(size, runs)
    for name, value, unit in measures:
        if value is not None:
            figures.append(Figure(f"sim_meta_{label}_{name}", value, unit, how))
    return figures


def _measures(size: dict[str, Any], runs: dict[str, Any]) -> list[tuple[str, float | None, str]]:
    from simulation.rollout_measures import rollout_summary
    from simulation.scenarios import scenario_config

    config = scenario_config("meta", hosts=size["hosts"], pools=size["pools"], days=size["days"])
    pools = [pool for shard in runs.get("trains", []) for pool in shard["pools"]]
    summary = rollout_summary(config, pools)
    hosts = sum(pool["hosts"] for pool in pools)
    drains = sum(pool["drains"] for pool in pools)
    return [
        ("drains_per_host", round(drains / hosts, 2) if hosts else None, "drains"),
        ("reach_72h_mean", summary["reach_72h_mean"], "share"),
        ("cycles_missed_keepable", summary["cycles_missed_keepable"], "cycles"),
    ]

"""Time below the floor: each pool measures its own hours below its floor, and a policy's total sums
them over its pools. Two pools below for an hour each at the same time are 2 pool-hours, not 2 hours:
the report says so wherever it shows the sum."""

from __future__ import annotations

from typing import Any

from simulation.config import SimulationConfig
from simulation.report import report_html, report_markdown_table, report_text, summarise

CONFIG = SimulationConfig(hosts=200, pools=2, hosts_per_domain=20, days=1, policies=("lockstep",))


def pool(name: str) -> dict[str, Any]:
    """A pool of 100 hosts, all of them drained for the first hour: one hour below its floor of 57."""
    return {
        "name": name, "hosts": 100, "domains": 5, "floor": 57,
        "samples": [[0.0, 0, 100, 0], [1.0, 100, 0, 0]],
        "planned_hours": 100.0, "failure_hours": 0.0, "hours_below_floor": 1.0, "min_in_service": 0,
        "drains": 100, "jobs": 0, "interrupted_by_drains": 0, "interrupted_by_failures": 0,
        "autostops": 0, "offboardings": 0, "cycles": [], "visits": [], "rollouts": [],
    }  # fmt: skip


def summary() -> dict[str, Any]:
    pools = [pool("sim-00"), pool("sim-01")]
    shard = {"policy": "lockstep", "label": "lock-step per pool", "wall_seconds": 1.0, "pools": pools}
    return summarise(CONFIG, {"lockstep": [shard]})


def test_the_text_report_calls_the_policys_sum_pool_hours_and_a_pools_own_figure_hours() -> None:
    text = report_text(summary())

    below = [" ".join(line.split()) for line in text.splitlines() if "below floor" in line]
    assert below == [
        "pool-hours below floor (summed over pools) 2.0",  # the policies side by side
        "hours below floor 1.0 1.0",  # the table per pool: each pool's own hours
    ]


def test_the_markdown_table_shows_the_sum_in_pool_hours() -> None:
    table = report_markdown_table(summary())

    assert "| hours below floor | 2.0 pool-hours |" in table


def test_the_html_report_calls_the_policys_sum_pool_hours() -> None:
    assert "pool-hours below floor" in report_html(summary(), {})

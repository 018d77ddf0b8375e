"""The domain-size advisor's cost, on built measures (no simulation): per cycle period,

    interruption cost x jobs interrupted by drains
    + capacity-hour cost x (buffer hosts x SLO hours + host-hours stranded by those interruptions),

and the page showing each size's stranded host-hours (a dash for a run advised before they existed)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from opsplanner import clock
from opsplanner.models import AdvisorRun, AdvisorRunState
from opsplanner.roles import Role
from simulation.advisor import AdvisorRequest, advice, advice_svg
from simulation.config import SimulationConfig
from tests.advisor_helpers import client_for, run_section
from tests.trains_builders import make_user

POOL = SimulationConfig(hosts=120, pools=1, cycle_slo_hours=24)
PAGE = "/simulations/advisor/"


def measured(domains: int, interrupted: int, stranded: float) -> list[dict[str, Any]]:
    """One size's run as simulation.measure reports it: one cycle done in 10 h, its upgrade everywhere."""
    pool = {
        "domains": domains, "cycles": [[1, 0.0, 10.0, 24.0]], "rollouts": [["os", "2", 0.0, 10.0, ""]],
        "planned_hours": 120.0, "interrupted_by_drains": interrupted, "stranded_host_hours_by_drains": stranded,
    }  # fmt: skip
    return [{"pools": [pool]}]


def advised(stranded_by_small_domains: float, interruption_cost: float = 10, capacity_hour_cost: float = 2) -> Any:
    request = AdvisorRequest(
        config=POOL, sizes=(10, 30), interruption_cost=interruption_cost, capacity_hour_cost=capacity_hour_cost
    )
    results = {"size-10": measured(12, 7, stranded_by_small_domains), "size-30": measured(4, 7, 50.0)}
    return advice(request, results)


def test_each_size_costs_its_interruptions_and_its_buffer_and_stranded_host_hours() -> None:
    small, large = advised(100.0)["points"]

    assert small["stranded_host_hours"] == 100.0
    assert small["interruption_cost"] == 7 * 10
    assert small["capacity_cost"] == (10 * 24 + 100.0) * 2
    assert small["stranded_cost"] == 100.0 * 2
    assert small["cost"] == 7 * 10 + (10 * 24 + 100.0) * 2
    assert large["cost"] == 7 * 10 + (30 * 24 + 50.0) * 2


def test_small_domains_lose_once_the_capacity_they_strand_outweighs_the_buffer_they_save() -> None:
    # Size 30 holds 480 more buffer host-hours than size 10 and strands 50.
    assert advised(stranded_by_small_domains=500.0)["recommended"] == 10
    assert advised(stranded_by_small_domains=550.0)["recommended"] == 30
    # The same interruptions at every size: what they cost does not choose between the sizes.
    assert advised(stranded_by_small_domains=500.0, interruption_cost=1e6)["recommended"] == 10


def test_the_reason_names_every_term_of_the_cost() -> None:
    reason = advised(1000.0)["reason"]

    assert reason == (
        "domains of 30 hosts cost 1610 per 24 h cycle: 7 interrupted jobs x 10 + "
        "(720 buffer + 50 stranded host-hours) x 2"
    )


def test_the_chart_draws_the_stranded_capacity_and_an_older_result_without_it() -> None:
    result = advised(100.0)
    assert "stranded capacity" in advice_svg(result)

    older = {**result, "points": [_before_stranded(p) for p in result["points"]]}
    svg = advice_svg(older)
    assert "buffer capacity" in svg
    assert "stranded capacity" not in svg


def _before_stranded(point: dict[str, Any]) -> dict[str, Any]:
    """A point as the advisor wrote it before stranded host-hours: its capacity cost the buffer's alone."""
    kept = {k: v for k, v in point.items() if k not in ("stranded_host_hours", "stranded_cost")}
    return kept | {"capacity_cost": point["capacity_cost"] - point["stranded_cost"]}


@pytest.mark.django_db
def test_the_page_shows_each_sizes_stranded_host_hours_and_a_dash_for_an_older_run() -> None:
    result = advised(1234.0)
    params = {"pool_hosts": 120, "sizes": [10, 30], "interruption_cost": 10, "capacity_hour_cost": 2}
    done = {"kind": "domain_size", "params": params, "requester": "test", "state": AdvisorRunState.DONE}
    run = AdvisorRun.objects.create(**done, result=result, finished_at=clock.now())
    older = AdvisorRun.objects.create(
        **done, result={**result, "points": [_before_stranded(p) for p in result["points"]]}, finished_at=clock.now()
    )
    viewer = client_for(make_user(Role.VIEWER))

    section = run_section(viewer.get(PAGE, {"run": run.pk}).content.decode(), run)
    assert "stranded host-hours</th>" in section
    # size, domains, interrupted jobs, buffer host-hours, stranded host-hours, worst cycle, missed, cost
    assert row_cells(section, 10)[3:5] == ["240", "1234"]
    older_section = run_section(viewer.get(PAGE, {"run": older.pk}).content.decode(), older)
    assert "<svg" in older_section  # the older run still renders, chart and all
    assert row_cells(older_section, 10)[3:5] == ["240", "\u2014"]


def row_cells(section: str, size: int) -> list[str]:
    """The numeric cells of one size's row in the table of sizes compared."""
    rows = re.findall(r"<tr[^>]*>(.*?)</tr>", section, re.S)
    cells = [re.findall(r'<td class="num">(.*?)</td>', row, re.S) for row in rows]
    return next(found for found in cells if found and found[0] == str(size))

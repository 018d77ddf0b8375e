"""Bad input on the advisor: a rate so high that the run's work has no end is refused by field, with
a clear message, before anything is queued (it would otherwise hold the one advisor slot for hours)."""

from __future__ import annotations

import pytest

from opsplanner.models import AdvisorRun
from opsplanner.roles import Role
from simulation.config import SimulationConfig
from tests.api_helpers import role_client

URL = "/api/advisor-runs/"
GOOD = {"pool_hosts": 400, "sizes": [16, 40, 80], "interruption_cost": 100, "capacity_hour_cost": 1.5}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("host_failures_per_day", 1e9, "host failures per day must be a number from 0 to 1"),
        ("optout_windows_per_week", 1e12, "optout windows per week must be a number from 0 to 168"),
    ],
)
def test_a_rate_without_bound_is_refused_by_field(field, value, words, enqueued) -> None:
    response = role_client(Role.OPERATOR).post(URL, {**GOOD, field: value}, format="json")
    assert response.status_code == 400, response.content
    assert words in " ".join(response.json()["errors"].get(field, [])), response.json()
    assert not AdvisorRun.objects.exists()
    assert enqueued == []


def test_the_simulator_refuses_arrivals_without_bound_too() -> None:
    problems = SimulationConfig(upgrades_per_week=1e12).errors()
    assert "upgrades per week must be a number from 0 to 168" in problems["upgrades_per_week"]
    assert SimulationConfig(upgrades_per_week=21.0, host_failures_per_day=1.0).errors() == {}

"""What the API and the forms accept for upgrades and trains: the same rules (the service's), the same
bounds (trains/limits.py), a refusal under the field the request named, nothing silently changed."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from opsplanner.roles import Role
from tests.builders import make_fleet
from tests.trains_builders import make_user
from trains.models import Train, Upgrade

pytestmark = pytest.mark.django_db
BIOS = {"component": "bios", "version": "2.16.0", "reason": "rollout"}


def api() -> APIClient:
    client = APIClient()
    client.force_authenticate(make_user(Role.OPERATOR))
    return client


def web() -> Client:
    client = Client()
    client.force_login(make_user(Role.OPERATOR))
    return client


def upgrade_form(pool_name: str, **overrides: str) -> dict[str, str]:
    return {"pool": pool_name, "component": "bios", "version": "2.16.0", "reason": "fix", "scope": "",
            "max_failures": "1", "max_failure_rate": "", "hosts_per_visit": "", **overrides}  # fmt: skip


@pytest.mark.parametrize(("bad", "said"), [({"component": "nope"}, "nope has no version"), ({"version": "9.9"}, "9.9")])
def test_an_unknown_component_or_version_is_refused_under_the_version_the_request_named(bad, said) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)

    response = api().post("/api/upgrades/", {"pool": pool.pk, **BIOS, **bad}, format="json")

    assert response.status_code == 400
    errors = response.json()["errors"]
    assert list(errors) == ["version"]
    assert said in str(errors["version"])


def test_an_empty_list_of_phases_is_refused_not_replaced_by_one_phase() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)

    response = api().post("/api/upgrades/", {"pool": pool.pk, **BIOS, "phases": []}, format="json")

    assert response.status_code == 400
    assert "phases" in response.json()["errors"]
    assert not Upgrade.objects.exists()


def test_a_failure_rate_finer_than_four_decimals_is_refused_by_the_api_as_by_the_form() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)

    form = web().post("/trains/upgrades/new/", upgrade_form(pool.name, max_failure_rate="0.00004"))
    response = api().post("/api/upgrades/", {"pool": pool.pk, **BIOS, "max_failure_rate": 0.00004}, format="json")

    assert form.status_code == 400
    assert response.status_code == 400  # rounded, it was 0: the first failure offboarded the upgrade
    assert "at most 4 decimal places" in str(response.json()["errors"]["max_failure_rate"])
    assert not Upgrade.objects.exists()
    ok = api().post("/api/upgrades/", {"pool": pool.pk, **BIOS, "max_failure_rate": 0.0125}, format="json")
    assert ok.status_code == 201
    assert str(Upgrade.objects.get().max_failure_rate) == "0.0125"


def test_hosts_per_visit_without_multi_cycle_is_refused_as_it_would_bound_nothing() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)

    response = api().post("/api/upgrades/", {"pool": pool.pk, **BIOS, "hosts_per_visit": 1}, format="json")
    form = web().post("/trains/upgrades/new/", upgrade_form(pool.name, hosts_per_visit="1"))

    assert response.status_code == 400
    assert "Only a multi-cycle upgrade" in str(response.json()["errors"]["hosts_per_visit"])
    assert form.status_code == 400
    assert not Upgrade.objects.exists()


def test_the_upgrade_form_takes_the_hosts_the_failure_rate_counts_from_as_the_api_does() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)

    response = web().post(
        "/trains/upgrades/new/", upgrade_form(pool.name, max_failure_rate="0.2", failure_rate_min_hosts="50")
    )

    assert response.status_code == 302
    assert Upgrade.objects.get().failure_rate_min_hosts == 50


@pytest.mark.parametrize(
    ("field", "days", "accepted"),
    [("visit_estimate_s", 7, True), ("visit_estimate_s", 20, False), ("visit_overhead_s", 7, True),
     ("visit_overhead_s", 20, False)],
)  # fmt: skip
def test_the_api_and_the_form_take_the_same_visit_times(field, days, accepted) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1)
    values = {"cycle_slo_s": 300 * 86400, field: days * 86400}

    by_api = api().post("/api/trains/", {"pool": pool.pk, "name": "t-api", **values}, format="json").status_code
    Train.objects.all().delete()
    form = {"pool": pool.name, "name": "t-form", "visit_estimate_s": "3600", "visit_concurrency": "1",
            "priority": "200", "domain_order": "", **{k: str(v) for k, v in values.items()}}  # fmt: skip
    by_form = web().post("/trains/new/", form).status_code

    assert (by_api, by_form) == ((201, 302) if accepted else (400, 400))

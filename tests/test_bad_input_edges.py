"""Bad input at the edges of the API and the services: a NUL where PostgreSQL refuses one, a body
nested deeper than Python's parser goes, values YAML or int() cannot build, numbers that are not
finite. Each is a 400 (or 401) that says what is wrong, never a 500, and writes nothing."""

from __future__ import annotations

import base64
import math
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from rest_framework.test import APIClient

from fleet.fleetfile.schema import FleetFileInvalid, load_document
from fleet.models import Pool
from opsplanner.models import AdvisorRun, Event, WorkItem, WorkState
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_item_batches import ItemReport, work_items_report_batch
from opsplanner.services.work_items import work_item_report
from simulation.advisor import AdvisorRequest
from simulation.config import SimulationConfig
from tests.api_helpers import role_client, token_client
from tests.builders import make_fleet
from tests.trains_builders import make_user

pytestmark = pytest.mark.django_db

DEEP_JSON = '{"pools": ' + "[" * 50_000 + "]" * 50_000 + "}"
YAML = {"content_type": "application/yaml"}


@pytest.fixture
def executor() -> APIClient:
    return token_client(make_user(Role.EXECUTOR))


def external_drains(client: APIClient, hosts: int) -> list[dict[str, Any]]:
    """Drains of a reboot run by external adapters, claimed by `client`."""
    pool, _ = make_fleet(domains=1, hosts_per_domain=hosts, planned_buffer_hosts=hosts)
    operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="r", drainer="external", executor="external")
    pool_tick(pool_id=pool.pk)
    response = client.post("/api/work-items/claim/", {"pool": pool.pk, "limit": hosts}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def done(item: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"id": item["id"], "attempt": item["attempt"], "outcome": "done", **extra}


# Work-item reports --------------------------------------------------------------------------------


def test_a_nul_in_a_reported_version_name_is_refused_and_the_rest_of_the_batch_goes_through(executor) -> None:
    bad, good = external_drains(executor, 2)
    reports = [done(bad, result={"versions": {"kernel\x00": "6.1"}}), done(good)]

    response = executor.post(
        "/api/work-items/report/", {"reports": reports}, format="json", headers={"Idempotency-Key": "b"}
    )

    assert response.status_code == 200, response.content
    refused, accepted = response.json()["results"]
    assert (refused["status"], refused["code"], accepted["status"]) == ("refused", "invalid", "accepted")
    assert "NUL" in refused["detail"]
    assert WorkItem.objects.get(pk=bad["id"]).state == WorkState.RUNNING
    assert WorkItem.objects.get(pk=good["id"]).state == WorkState.DONE


def test_a_single_report_with_a_nul_in_a_version_name_is_a_400_on_the_result(executor) -> None:
    (item,) = external_drains(executor, 1)
    body = done(item, result={"versions": {"kernel\x00": "6.1"}})

    response = executor.post(
        f"/api/work-items/{item['id']}/report/", body, format="json", headers={"Idempotency-Key": "k"}
    )

    assert response.status_code == 400, response.content
    assert "NUL" in " ".join(response.json()["errors"]["result"])
    assert WorkItem.objects.get(pk=item["id"]).state == WorkState.RUNNING


@pytest.mark.parametrize(
    ("result", "reason", "field"),
    [
        ({"versions": {"kernel": "6.1\x00"}}, "", "result"),
        ({"details": "out\x00put"}, "", "result"),
        ({"steps": [{"name": "install", "output_tail": "\x00"}]}, "", "result"),
        ({}, "drained\x00", "reason"),
    ],
)
def test_a_nul_in_any_text_of_a_report_is_refused_by_the_service_before_anything_is_written(
    executor, result, reason, field
) -> None:
    first, second = external_drains(executor, 2)
    worker = executor.user.get_username()
    events = Event.objects.count()

    with pytest.raises(ValidationError) as refused:
        work_item_report(item_id=first["id"], worker=worker, key="k1", outcome="done", result=result, reason=reason)
    (answer,) = work_items_report_batch(
        worker=worker, reports=[ItemReport(second["id"], second["attempt"], "done", "k2", result, reason)]
    )

    assert field in refused.value.message_dict
    assert (answer.status, answer.code) == ("refused", "invalid")
    assert set(WorkItem.objects.filter(pk__in=[first["id"], second["id"]]).values_list("state", flat=True)) == {
        WorkState.RUNNING
    }
    assert Event.objects.count() == events


# Bodies nested too deeply -------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/fleet/apply/?dry_run=true", "/api/operations/", "/api/advisor-runs/"])
def test_a_json_body_nested_fifty_thousand_deep_is_a_400_parse_error_on_every_endpoint(path) -> None:
    response = role_client(Role.OPERATOR).post(path, DEEP_JSON, content_type="application/json")

    assert response.status_code == 400, response.content
    assert response.json()["code"] == "parse_error"
    assert "nested too deeply" in response.json()["detail"]


def test_a_fleet_file_nested_too_deeply_is_invalid_at_the_document_whether_sent_as_yaml_or_read() -> None:
    with pytest.raises(FleetFileInvalid) as invalid:
        load_document(DEEP_JSON)
    response = role_client(Role.OPERATOR).post("/api/fleet/apply/?dry_run=true", DEEP_JSON, **YAML)

    assert [str(problem) for problem in invalid.value.problems] == ["document: nested too deeply to read"]
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == {"document": ["nested too deeply to read"]}


# Values the loaders cannot build -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("version: 2024-13-45\n", "month must be in 1..12"),
        ("pools:\n- name: p1\n  description: 2024-02-30\n", "day is out of range for month"),
        ("pools:\n- name: p1\n  description: 2024-02-01t25:00:00\n", "hour must be in 0..23"),
        ("version: " + "9" * 5000 + "\n", "Exceeds the limit (4300 digits)"),
        ("version: 0x" + "f" * 5000 + "\n", "an integer of over 4,200 digits"),  # no limit in base 16
        (
            "pools:\n- name: &p p1\n  description: 0" + "7" * 5000 + "\n",
            "an integer of over 4,200 digits",
        ),  # octal; an anchor: yaml.load
        ('{"version": ' + "9" * 5000 + "}", "Exceeds the limit (4300 digits)"),
    ],
)
def test_a_fleet_file_value_yaml_or_python_cannot_build_is_a_400_on_the_document(text, words) -> None:
    response = role_client(Role.OPERATOR).post("/api/fleet/apply/", text, **YAML)

    assert response.status_code == 400, response.content
    (message,) = response.json()["errors"]["document"]
    assert message.startswith("a value cannot be read: ")
    assert words in message
    assert "set_int_max_str_digits" not in message  # Python's advice is not the user's
    assert not Pool.objects.exists()


# HTTP Basic ----------------------------------------------------------------------------------------


def test_a_basic_login_with_a_nul_in_the_username_or_password_is_a_401_not_a_500() -> None:
    user = make_user(Role.OPERATOR)

    for username, password in ((f"{user.username}\x00", "x-pass-123"), (user.username, "x-pass-123\x00")):
        credentials = base64.b64encode(f"{username}:{password}".encode()).decode()
        response = APIClient().post("/api/auth/login/", headers={"Authorization": f"Basic {credentials}"})

        assert response.status_code == 401, response.content
        assert response.json()["detail"] == "Invalid username/password."


# The simulator's knobs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("drain_minutes", math.inf),
        ("drain_minutes", 1e307),
        ("verify_minutes", math.nan),
        ("execute_minutes", 7 * 24 * 60 + 1),
        ("undrain_minutes", 1e9),
        ("days", math.nan),
        ("tick_minutes", math.nan),
        ("tick_minutes", 24 * 60 + 1),
        ("cycle_slo_hours", math.nan),
        ("cycle_slo_hours", math.inf),
        ("host_failures_per_day", math.inf),
        ("slow_host_factor", math.nan),
        ("host_spread", math.nan),
        ("seed", 2**31),
        ("job_hosts_max", 10**30),
        ("hosts", 10**400),  # an int past any float: math.isfinite would overflow on it
        ("job_hosts_max", 10**400),
    ],
)
def test_a_simulation_knob_that_is_not_finite_or_past_its_bound_is_named_and_errors_never_raises(field, value) -> None:
    problems = SimulationConfig(**{field: value}).errors()

    assert list(problems) == [field]
    assert field.replace("_", " ") in problems[field]


def test_an_advisor_request_with_a_nan_slo_names_the_slo_not_each_sizes_days() -> None:
    request = AdvisorRequest(
        config=SimulationConfig(pools=1, cycle_slo_hours=math.nan),
        sizes=(10, 25),
        interruption_cost=1,
        capacity_hour_cost=1,
    )

    assert list(request.errors()) == ["cycle_slo_hours"]


def test_an_advisor_run_with_a_drain_of_1e307_minutes_is_a_400_on_the_field_and_queues_nothing(enqueued) -> None:
    body = {
        "pool_hosts": 400,
        "sizes": [16, 40],
        "interruption_cost": 1,
        "capacity_hour_cost": 1,
        "drain_minutes": 1e307,
    }

    response = role_client(Role.OPERATOR).post("/api/advisor-runs/", body, format="json")

    assert response.status_code == 400, response.content
    assert "drain minutes must be a number from 0 to 10,080 minutes" in " ".join(
        response.json()["errors"]["drain_minutes"]
    )
    assert not AdvisorRun.objects.exists()
    assert enqueued == []

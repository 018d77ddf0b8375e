"""POST /api/fleet/apply/: operators apply a fleet file (JSON or YAML text); others may not."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.models import Host, Pool
from opsplanner.models import Event
from opsplanner.roles import Role
from tests.api_helpers import role_client

pytestmark = pytest.mark.django_db

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "fleet.yaml"
YAML = {"content_type": "application/yaml"}


def test_an_operator_applies_a_yaml_fleet_file_and_gets_the_plan() -> None:
    response = role_client(Role.OPERATOR).post("/api/fleet/apply/", EXAMPLE.read_text(), **YAML)

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["applied"] is True
    assert body["dry_run"] is False
    assert body["counts"]["host"] == {"create": 6, "update": 0, "remove": 0}
    assert {"kind": "host", "action": "create", "name": "web-a-01", "fields": {}, "note": ""} in body["changes"]
    assert Host.objects.count() == 6
    again = role_client(Role.OPERATOR).post("/api/fleet/apply/", EXAMPLE.read_text(), **YAML).json()
    assert again["changes"] == []
    assert again["applied"] is False


def test_a_dry_run_answers_the_plan_and_writes_nothing() -> None:
    document = {"pools": [{"name": "p1", "workload_class": "web", "planned_buffer": 1, "failure_buffer": "5%"}]}

    response = role_client(Role.OPERATOR).post("/api/fleet/apply/?dry_run=true", document, format="json")

    assert response.status_code == 200, response.content
    assert response.json()["changes"][0]["name"] == "p1"
    assert response.json()["dry_run"] is True
    assert Pool.objects.count() == 0
    assert Event.objects.count() == 0


def test_a_viewer_may_not_apply_a_fleet_file() -> None:
    response = role_client(Role.VIEWER).post("/api/fleet/apply/?dry_run=true", {}, format="json")

    assert response.status_code == 403


def test_errors_are_a_400_with_every_error_by_its_place() -> None:
    document = {
        "pools": [{"name": "p1", "workload_class": "gpu", "planned_buffer": 1, "failure_buffer": 1}],
        "hosts": [{"hostname": "h1", "pool": "p1", "domain": "rack-99", "sku": "s", "gpu_count": -1}],
    }

    response = role_client(Role.OPERATOR).post("/api/fleet/apply/", document, format="json")

    assert response.status_code == 400
    assert response.json()["errors"] == {
        "pools[0].workload_class": ["'gpu' is not one of ai_training, ai_inference, web, storage, other"],
        "hosts[0].domain": ["no domain 'rack-99' in pool p1"],
        "hosts[0].gpu_count": ["must be between 0 and 64, not -1"],
    }
    assert Pool.objects.count() == 0

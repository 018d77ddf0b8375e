"""The admin validates with the models' messages (full_clean) and writes nothing on refusal."""

from __future__ import annotations

import pytest

from fleet.models import CompatibilityRule, ComponentLayer, ComponentVersion, Host
from opsplanner.models import Event
from tests.builders import make_component, make_domain, make_pool, make_version

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, django_user_model):
    user = django_user_model.objects.create_superuser(username="root", password="root-password-1")
    client.force_login(user)
    return client


def test_the_admin_refuses_a_host_in_a_domain_of_another_pool(admin_client) -> None:
    east = make_pool(name="east")
    west_rack = make_domain(make_pool(name="west"), name="rack-0001")
    response = admin_client.post(
        "/admin/fleet/host/add/",
        {
            "hostname": "stray-1",
            "pool": east.pk,
            "domain": west_rack.pk,
            "sku": "gpu-h100-8x",
            "gpu_count": 8,
            "installed_versions-TOTAL_FORMS": 0,
            "installed_versions-INITIAL_FORMS": 0,
        },
    )
    assert response.status_code == 200
    assert "Domain rack-0001 belongs to pool west, not to this host&#x27;s pool east." in response.content.decode()
    assert not Host.objects.exists()


def test_the_admin_refuses_a_version_that_is_not_a_version(admin_client) -> None:
    component = make_component()
    response = admin_client.post(
        "/admin/fleet/componentversion/add/",
        {"component": component.pk, "version": "latest", "released_at_0": "2026-11-01", "released_at_1": "00:00"},
    )
    assert response.status_code == 200
    assert "is not a version" in response.content.decode()
    assert not ComponentVersion.objects.exists()


def test_the_admin_fills_the_sort_keys_of_a_compatibility_rule(admin_client) -> None:
    cuda = make_version(make_component(ComponentLayer.JOB_FACING), "12.4.1")
    driver = make_component()
    response = admin_client.post(
        "/admin/fleet/compatibilityrule/add/",
        {"job_facing_version": cuda.pk, "lower_component": driver.pk, "min_version": "550.54.14", "max_version": ""},
    )
    assert response.status_code == 302, response.content.decode()
    rule = CompatibilityRule.objects.get()
    assert rule.allows("000000560.000000035.000000003.000000000.000000000.000000000~")
    assert not rule.allows("000000535.000000183.000000001.000000000.000000000.000000000~")


def test_the_event_log_cannot_be_edited_in_the_admin(admin_client) -> None:
    make_pool()
    event = Event.objects.get()
    assert admin_client.get("/admin/opsplanner/event/").status_code == 200
    assert admin_client.get("/admin/opsplanner/event/add/").status_code == 403
    admin_client.post(f"/admin/opsplanner/event/{event.pk}/change/", {"kind": "forged"})
    admin_client.post(f"/admin/opsplanner/event/{event.pk}/delete/", {"post": "yes"})
    event.refresh_from_db()
    assert event.kind == "pool.created"


def test_admin_lists_of_the_inventory_open(admin_client) -> None:
    make_domain()
    models = ["pool", "maintenancedomain", "host", "component", "componentversion", "installedversion"]
    models += ["compatibilityrule", "service", "serviceplacement", "optoutwindow", "capacityreservation"]
    for model in models:
        response = admin_client.get(f"/admin/fleet/{model}/?q=x")
        assert response.status_code == 200, model


def test_orchestration_state_is_read_only_in_the_admin(admin_client) -> None:
    for model in ("operation", "hosttask", "lease", "workitem"):
        assert admin_client.get(f"/admin/opsplanner/{model}/").status_code == 200, model
        assert admin_client.get(f"/admin/opsplanner/{model}/add/").status_code == 403, model

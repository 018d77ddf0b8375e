"""Every inventory write made in the Django admin is an event: add, change and delete each leave
one (kind, subject, actor, the changed fields with their values before and after), in the same
transaction as the write. A delete that history forbids is refused with the reason and writes
nothing. Orchestration state, opt-out windows and reservations are read-only in the admin."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db.models import Model
from django.test import Client

from fleet.models import (
    CompatibilityRule,
    Component,
    ComponentLayer,
    ComponentVersion,
    Host,
    InstalledVersion,
    MaintenanceDomain,
    Pool,
    Service,
    ServicePlacement,
)
from fleet.services import host_transition
from fleet.services.audit import inventory_record_delete, inventory_record_save
from opsplanner.models import Event, SimulatorProfile
from opsplanner.services.operations import operation_submit
from tests.builders import make_component, make_domain, make_host, make_pool, make_service, make_version

pytestmark = pytest.mark.django_db

WHEN = {"_0": "2026-11-01", "_1": "00:00:00"}


def _at(name: str) -> dict[str, str]:
    return {f"{name}{suffix}": value for suffix, value in WHEN.items()}


def _no_inline(prefix: str) -> dict[str, Any]:
    return {f"{prefix}-TOTAL_FORMS": 0, f"{prefix}-INITIAL_FORMS": 0}


@pytest.fixture
def admin_client(client: Client, django_user_model: Any) -> Client:
    user = django_user_model.objects.create_superuser(username="root", password="root-password-1")
    client.force_login(user)
    return client


@dataclass(frozen=True)
class Case:
    """One inventory model: the admin form to add one, and one field to change on it."""

    model: type[Model]
    kind: str
    form: Callable[[], dict[str, Any]]
    change: dict[str, Any]
    pool_scoped: bool = False


def _pool_form() -> dict[str, Any]:
    # The browser sends the adapters' preselected defaults with the form.
    return {
        "name": "east", "workload_class": "ai_training", "planned_buffer_hosts": 2, "failure_buffer_hosts": 1,
        "executor": "simulated", "drainer": "simulated",
    }  # fmt: skip


def _host_form() -> dict[str, Any]:
    domain = make_domain()
    fields = {"hostname": "gpu-0001", "pool": domain.pool_id, "domain": domain.pk, "sku": "h100", "gpu_count": 8}
    return {**fields, **_no_inline("installed_versions")}


def _installed_form() -> dict[str, Any]:
    driver = make_component()
    version = make_version(driver, "560.35.03")
    host = make_host()
    return {"host": host.pk, "component": driver.pk, "version": version.pk, **_at("installed_at")}


def _rule_form() -> dict[str, Any]:
    cuda = make_version(make_component(ComponentLayer.JOB_FACING), "12.4.1")
    return {"job_facing_version": cuda.pk, "lower_component": make_component().pk, "min_version": "550.54.14"}


def _profile_form() -> dict[str, Any]:
    return {
        "seed": 7,
        "drain_seconds": 20,
        "slow_host_fraction": 0,
        "slow_drain_factor": 5,
        "refusing_host_fraction": 0,
        "execute_seconds": 30,
        "execute_failure_rate": 0,
        "verify_seconds": 10,
        "verify_failure_rate": 0,
        "undrain_seconds": 5,
        "execute_by_kind": "{}",
        "batch_size": 500,
    }


CASES = [
    Case(Pool, "pool", lambda: {**_pool_form(), **_at("created_at")}, {"planned_buffer_hosts": 3}, True),
    Case(
        MaintenanceDomain,
        "domain",
        lambda: {"pool": make_pool().pk, "name": "rack-1", "kind": "rack", "position": 0, **_at("created_at")},
        {"position": 4},
        True,
    ),
    Case(Host, "host", _host_form, {"sku": "h200", "gpu_count": 4}, True),
    Case(
        Component,
        "component",
        lambda: {"name": "nic-fw", "display_name": "NIC firmware", "layer": "lower_level", "needs_drain": "on"},
        {"needs_reboot": "on"},
    ),
    Case(
        ComponentVersion,
        "component_version",
        lambda: {"component": make_component().pk, "version": "2.16.0", **_at("released_at")},
        {"withdrawn_reason": "bricks NICs", **_at("withdrawn_at")},
    ),
    Case(InstalledVersion, "installed_version", _installed_form, {"installed_at_0": "2026-11-02"}, True),
    Case(CompatibilityRule, "compatibility_rule", _rule_form, {"max_version": "570.0"}),
    Case(Service, "service", lambda: {"name": "llm", "display_name": "LLM"}, {"display_name": "Large models"}),
    Case(
        ServicePlacement,
        "service_placement",
        lambda: {"service": make_service().pk, "host": make_host().pk, "running_jobs": 1},
        {"running_jobs": 3},
        True,
    ),
    Case(SimulatorProfile, "simulator_profile", _profile_form, {"seed": 8}),
]
CREATED_KIND = {"component_version": "component.version_added"}


def _url(model: type[Model], suffix: str) -> str:
    return f"/admin/{model._meta.app_label}/{model._meta.model_name}/{suffix}"


def _post(client: Client, url: str, data: dict[str, Any]) -> None:
    response = client.post(url, data)
    assert response.status_code == 302, response.content.decode()[-3000:]


def _event(case: Case, obj: Model, action: str) -> Event:
    return Event.objects.get(subject_type=case.model._meta.label_lower, subject_id=obj.pk, kind__endswith=action)


@pytest.mark.parametrize("case", CASES, ids=[case.kind for case in CASES])
def test_an_inventory_row_added_in_the_admin_is_an_event(admin_client: Client, case: Case) -> None:
    data = case.form()
    _post(admin_client, _url(case.model, "add/"), data)

    obj = case.model.objects.order_by("pk").last()
    event = Event.objects.get(subject_type=case.model._meta.label_lower, subject_id=obj.pk)
    assert event.kind == CREATED_KIND.get(case.kind, f"{case.kind}.created")
    assert (event.actor, event.reason) == ("root", "changed in the admin")
    assert event.data["before"] == {}
    assert "id" in event.data["changed_fields"]
    assert event.data["after"]["id"] == obj.pk
    if case.pool_scoped:
        assert event.pool_id is not None


@pytest.mark.parametrize("case", [c for c in CASES if c.change], ids=[c.kind for c in CASES if c.change])
def test_an_inventory_row_changed_in_the_admin_is_an_event_naming_the_changed_fields(
    admin_client: Client, case: Case
) -> None:
    data = case.form()
    _post(admin_client, _url(case.model, "add/"), data)
    obj = case.model.objects.order_by("pk").last()

    _post(admin_client, _url(case.model, f"{obj.pk}/change/"), {**data, **case.change})

    event = _event(case, obj, ".updated")
    changed = sorted({name.removesuffix("_0").removesuffix("_1") for name in case.change})
    assert set(changed) <= set(event.data["changed_fields"])  # with what they derive (a rule's sort keys)
    assert (event.actor, event.subject_id) == ("root", obj.pk)
    obj.refresh_from_db()
    for name in changed:
        assert event.data["after"][name] != event.data["before"][name]


def test_saving_an_unchanged_row_writes_no_event(admin_client: Client) -> None:
    data = {**_pool_form(), **_at("created_at")}
    _post(admin_client, _url(Pool, "add/"), data)
    pool = Pool.objects.get()

    _post(admin_client, _url(Pool, f"{pool.pk}/change/"), data)

    assert Event.objects.filter(subject_type="fleet.pool").count() == 1


def test_a_pool_change_records_its_values_before_and_after(admin_client: Client) -> None:
    data = {**_pool_form(), **_at("created_at")}
    _post(admin_client, _url(Pool, "add/"), data)
    pool = Pool.objects.get()

    _post(admin_client, _url(Pool, f"{pool.pk}/change/"), {**data, "planned_buffer_hosts": 5, "description": "h100"})

    event = Event.objects.get(kind="pool.updated")
    assert event.data["changed_fields"] == ["description", "planned_buffer_hosts"]
    assert event.data["before"] == {"description": "", "planned_buffer_hosts": 2}
    assert event.data["after"] == {"description": "h100", "planned_buffer_hosts": 5}
    assert event.pool_id == pool.pk


def test_an_edit_does_not_undo_a_host_state_changed_since_the_form_was_read() -> None:
    host = make_host()
    read_by_the_form = Host.objects.get(pk=host.pk)
    assert host_transition(host_id=host.pk, expected="in_service", new="failed", reason="PSU")

    read_by_the_form.sku = "h200"
    inventory_record_save(obj=read_by_the_form, actor="test", fields=["hostname", "pool", "domain", "sku"])

    host.refresh_from_db()
    assert (host.state, host.sku) == ("failed", "h200")
    assert Event.objects.get(kind="host.updated").data["changed_fields"] == ["sku"]


def test_a_write_of_an_unaudited_model_is_refused_before_anything_is_written(django_user_model: Any) -> None:
    with pytest.raises(ValueError, match="no audited writes"):
        inventory_record_save(obj=django_user_model(username="mallory"), actor="test")

    assert not django_user_model.objects.filter(username="mallory").exists()


def test_the_owners_of_a_service_are_in_its_events(admin_client: Client, django_user_model: Any) -> None:
    owner = django_user_model.objects.create_user(username="alice")
    data = {"name": "llm", "display_name": "LLM", "owners": [owner.pk]}
    _post(admin_client, _url(Service, "add/"), data)
    service = Service.objects.get()
    created = Event.objects.get(kind="service.created")
    assert created.data["after"]["owners"] == [owner.pk]

    _post(admin_client, _url(Service, f"{service.pk}/change/"), {**data, "owners": []})

    updated = Event.objects.get(kind="service.updated")
    assert updated.data["changed_fields"] == ["owners"]
    assert (updated.data["before"]["owners"], updated.data["after"]["owners"]) == ([owner.pk], [])
    assert not service.owners.exists()


def test_an_installed_version_added_inline_on_a_host_is_an_event(admin_client: Client) -> None:
    host = make_host()
    version = make_version(make_component(), "1.2.3")
    data = {
        "hostname": host.hostname,
        "pool": host.pool_id,
        "domain": host.domain_id,
        "sku": host.sku,
        "gpu_count": host.gpu_count,
        "installed_versions-TOTAL_FORMS": 1,
        "installed_versions-INITIAL_FORMS": 0,
        "installed_versions-0-component": version.component_id,
        "installed_versions-0-version": version.pk,
        **{f"installed_versions-0-installed_at{suffix}": value for suffix, value in WHEN.items()},
    }
    _post(admin_client, _url(Host, f"{host.pk}/change/"), data)

    event = Event.objects.get(kind="installed_version.created")
    assert (event.host_id, event.actor) == (host.pk, "root")
    assert event.data["after"]["version"] == version.pk
    assert not Event.objects.filter(kind="host.updated").exists()


def test_a_host_deleted_in_the_admin_is_an_event_with_what_went_with_it(admin_client: Client) -> None:
    host = make_host()
    version = _any_version()
    InstalledVersion.objects.create(host=host, component_id=version.component_id, version=version)

    response = admin_client.post(_url(Host, f"{host.pk}/delete/"), {"post": "yes"})

    assert response.status_code == 302
    assert not Host.objects.filter(pk=host.pk).exists()
    event = Event.objects.get(kind="host.deleted")
    assert (event.subject_id, event.host_id, event.pool_id, event.actor) == (host.pk, host.pk, host.pool_id, "root")
    assert event.data["before"]["hostname"] == host.hostname
    assert event.data["cascaded"] == {"fleet.InstalledVersion": 1}


def _any_version() -> ComponentVersion:
    return make_version(make_component(), "9.9.9")


def test_the_admin_refuses_to_delete_a_host_with_history_and_says_why(admin_client: Client) -> None:
    host = make_host()
    operation_submit(kind="reboot", scope=f"hosts: {host.hostname}", reason="kernel")

    response = admin_client.post(_url(Host, f"{host.pk}/delete/"), {"post": "yes"})

    assert response.status_code == 200
    page = response.content.decode()
    assert "Cannot delete host" in page
    assert "would require deleting the following protected related objects" in page
    assert "Host task: <a" in page
    assert Host.objects.filter(pk=host.pk).exists()
    assert not Event.objects.filter(kind="host.deleted").exists()


def test_the_delete_service_refuses_a_host_with_history_naming_what_holds_it() -> None:
    host = make_host()
    operation_submit(kind="reboot", scope=f"hosts: {host.hostname}", reason="kernel")

    with pytest.raises(ValidationError) as refused:
        inventory_record_delete(obj=host, actor="test")

    assert refused.value.code == "protected"
    assert "host tasks" in refused.value.messages[0]
    assert Host.objects.filter(pk=host.pk).exists()
    assert not Event.objects.filter(kind="host.deleted").exists()


def test_deleting_several_rows_from_the_list_writes_one_event_each(admin_client: Client) -> None:
    components = [make_component(), make_component()]

    response = admin_client.post(
        _url(Component, ""),
        {"action": "delete_selected", "_selected_action": [c.pk for c in components], "post": "yes"},
    )

    assert response.status_code == 302
    assert not Component.objects.exists()
    deleted = Event.objects.filter(kind="component.deleted")
    assert sorted(deleted.values_list("subject_id", flat=True)) == sorted(c.pk for c in components)


@pytest.mark.parametrize(
    "model_name", ["optoutwindow", "capacityreservation", "workerheartbeat", "operation", "hosttask", "lease"]
)
def test_rows_owned_by_services_cannot_be_added_in_the_admin(admin_client: Client, model_name: str) -> None:
    app = "fleet" if model_name in ("optoutwindow", "capacityreservation") else "opsplanner"

    assert admin_client.get(f"/admin/{app}/{model_name}/add/").status_code == 403
    assert admin_client.get(f"/admin/{app}/{model_name}/").status_code == 200


def test_the_admin_refuses_to_move_a_host_under_live_work_and_says_why(admin_client: Client) -> None:
    host = make_host()
    elsewhere = make_domain()
    operation = operation_submit(kind="reboot", scope=f"hosts: {host.hostname}", reason="kernel patch")
    data = {
        "hostname": host.hostname, "pool": elsewhere.pool_id, "domain": elsewhere.pk, "sku": host.sku,
        "gpu_count": host.gpu_count, **_no_inline("installed_versions"),
    }  # fmt: skip

    response = admin_client.post(_url(Host, f"{host.pk}/change/"), data)

    assert response.status_code == 200  # the form again, with the refusal
    assert f"it is named by open operation #{operation.pk}" in response.content.decode()
    host.refresh_from_db()
    assert (host.pool_id, host.domain_id) != (elsewhere.pool_id, elsewhere.pk)
    assert not Event.objects.filter(kind="host.updated").exists()


def test_the_admin_moves_a_host_with_no_live_work(admin_client: Client) -> None:
    host = make_host()
    elsewhere = make_domain()
    data = {
        "hostname": host.hostname, "pool": elsewhere.pool_id, "domain": elsewhere.pk, "sku": host.sku,
        "gpu_count": host.gpu_count, **_no_inline("installed_versions"),
    }  # fmt: skip

    _post(admin_client, _url(Host, f"{host.pk}/change/"), data)

    host.refresh_from_db()
    assert (host.pool_id, host.domain_id) == (elsewhere.pool_id, elsewhere.pk)


def test_the_admin_refuses_a_planned_buffer_below_the_hosts_out_for_planned_work(admin_client: Client) -> None:
    data = {**_pool_form(), **_at("created_at")}
    _post(admin_client, _url(Pool, "add/"), data)
    pool = Pool.objects.get()
    host = make_host(domain=make_domain(pool))
    assert host_transition(host_id=host.pk, expected="in_service", new="draining", reason="planned work")

    response = admin_client.post(_url(Pool, f"{pool.pk}/change/"), {**data, "planned_buffer_hosts": 0})

    assert response.status_code == 200
    assert "below the 1 hosts out for planned work now" in response.content.decode()
    assert Pool.objects.get().planned_buffer_hosts == 2

"""Single changes to the inventory through the API: hosts (create, move, relabel, retire, restore,
what they run and drift), pools, domains, components, versions, rules, services and placements;
each through its service, with its event, refused under live work with the operation named."""

from __future__ import annotations

import pytest

from console.metrics import collect
from fleet.models import CompatibilityRule, Host, HostState, InstalledVersion, Pool
from fleet.services import service_place
from opsplanner.models import Event, Lease
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from tests.api_helpers import role_client, token_client
from tests.builders import make_fleet, make_service
from tests.trains_builders import make_user
from trains.models import Upgrade, UpgradeState
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

REASON = {"reason": "rack decommissioned"}


@pytest.fixture
def operator():
    return role_client(Role.OPERATOR)


def events(kind: str) -> list[Event]:
    return list(Event.objects.filter(kind=kind).order_by("pk"))


def test_an_operator_creates_a_host_with_labels_named_by_the_fleet_files_fields(operator) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1)
    row = {"hostname": "gpu-new-1", "pool": pool.name, "domain": "rack-0001", "sku": "h100", "labels": {"row": 7}}

    response = operator.post("/api/hosts/", row, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["hostname"], body["pool_name"], body["labels"]) == ("gpu-new-1", pool.name, {"row": 7})
    assert [e.host_id for e in events("host.created")][-1] == body["id"]


def test_a_new_host_in_a_domain_its_pool_lacks_is_refused_naming_the_field(operator) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=1)
    row = {"hostname": "gpu-new-2", "pool": pool.name, "domain": "rack-99", "sku": "h100"}

    response = operator.post("/api/hosts/", row, format="json")

    assert response.status_code == 400
    assert response.json()["errors"] == {"domain": [f"no domain 'rack-99' in pool {pool.name}"]}
    assert not Host.all_objects.filter(hostname="gpu-new-2").exists()


def test_moving_and_relabelling_a_host_by_name_records_each_field_before_and_after(operator) -> None:
    _, hosts = make_fleet(domains=2, hosts_per_domain=1)
    host = hosts[0]

    response = operator.patch(
        f"/api/hosts/{host.hostname}/", {"domain": "rack-0002", "labels": {"switch": "sw-3"}}, format="json"
    )

    assert response.status_code == 200, response.content
    assert (response.json()["domain_name"], response.json()["labels"]) == ("rack-0002", {"switch": "sw-3"})
    (event,) = events("host.updated")
    assert event.data["changed_fields"] == ["domain", "labels"]
    assert (event.data["before"]["domain"], event.data["after"]["domain"]) == (host.domain_id, hosts[1].domain_id)


def test_a_host_under_a_lease_is_neither_moved_nor_retired_and_the_operation_is_named(operator) -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=1)
    operation = operation_submit(kind="reboot", scope=f"domain {pool.name}/rack-0001", reason="kernel fix")
    pool_tick(pool_id=pool.pk)
    held = Host.objects.get(pk=Lease.objects.get(active=True).host_id)

    moved = operator.patch(f"/api/hosts/{held.hostname}/", {"domain": "rack-0002"}, format="json")
    retired = operator.post(f"/api/hosts/{held.hostname}/retire/", REASON, format="json")

    for response, verb in ((moved, "not moved to domain rack-0002"), (retired, "not retired")):
        assert response.status_code == 409, response.content
        assert response.json()["detail"] == (
            f"host {held.hostname}: {verb}: it is held by operation #{operation.pk} (reboot: kernel fix)"
        )
    held.refresh_from_db()
    assert (held.domain.name, held.state) == ("rack-0001", HostState.DRAINING)
    assert not events("host.updated")


def test_a_retired_host_leaves_every_count_and_comes_back_when_restored(operator) -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=3)
    host = hosts[0]

    retired = operator.post(f"/api/hosts/{host.hostname}/retire/", REASON, format="json")

    assert retired.status_code == 200, retired.content
    assert retired.json()["state"] == "retired"
    assert operator.get(f"/api/pools/{pool.pk}/").json()["usage"]["total"] == 2
    assert operator.get(f"/api/domains/{host.domain_id}/").json()["hosts"] == 2
    assert host.pk not in {h["id"] for h in operator.get("/api/hosts/").json()["results"]}
    again = operator.post(f"/api/hosts/{host.hostname}/retire/", REASON, format="json")
    assert (again.status_code, again.json()["detail"]) == (409, f"Host {host.hostname} is retired already.")

    restored = operator.post(f"/api/hosts/{host.pk}/restore/", {"reason": "back from repair"}, format="json")

    assert restored.status_code == 200, restored.content
    assert restored.json()["state"] == HostState.IN_SERVICE
    assert operator.get(f"/api/pools/{pool.pk}/").json()["usage"]["total"] == 3
    assert [e.data["to"] for e in events("host.state_changed")] == ["retired", "in_service"]


def test_a_pool_buffer_is_not_lowered_below_what_is_out_and_the_numbers_are_named(operator) -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=4, planned_buffer_hosts=2)
    Host.objects.filter(pk__in=[h.pk for h in hosts[:2]]).update(state=HostState.MAINTENANCE)

    lowered = operator.patch(f"/api/pools/{pool.pk}/", {"planned_buffer_hosts": 1}, format="json")
    raised = operator.patch(f"/api/pools/{pool.pk}/", {"planned_buffer_hosts": 3}, format="json")

    assert lowered.status_code == 409
    assert lowered.json()["detail"] == (
        f"pool {pool.name}: the planned buffer would be 1 hosts, below the 2 hosts out for planned work now"
    )
    assert raised.status_code == 200, raised.content
    assert raised.json()["planned_buffer_hosts"] == 3
    assert events("pool.updated")[-1].data["after"] == {"planned_buffer_hosts": 3}


def test_a_pool_is_created_and_changed_with_its_executor_and_drainer(operator) -> None:
    body = {"name": "east", "workload_class": "web", "planned_buffer_hosts": 1, "failure_buffer_fraction": "0.05"}

    created = operator.post("/api/pools/", {**body, "executor": "ssh"}, format="json")
    changed = operator.patch(f"/api/pools/{created.json()['id']}/", {"drainer": "slurm"}, format="json")
    refused = operator.patch(f"/api/pools/{created.json()['id']}/", {"drainer": "ssh"}, format="json")

    assert created.status_code == 201, created.content
    assert changed.status_code == 200, changed.content
    assert (changed.json()["executor"], changed.json()["drainer"]) == ("ssh", "slurm")
    assert refused.status_code == 400
    assert Pool.objects.get(name="east").drainer == "slurm"


def test_withdrawing_a_version_offboards_its_upgrades_and_a_second_withdrawal_names_why(operator) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="refresh")
    component = upgrade.component_version.component
    path = f"/api/components/{component.pk}/versions/560.35.03/withdraw/"

    first = operator.post(path, {"reason": "breaks NCCL"}, format="json")
    second = operator.post(path, {"reason": "again"}, format="json")

    assert first.status_code == 200, first.content
    version = next(v for v in first.json()["versions"] if v["version"] == "560.35.03")
    assert (version["withdrawn_reason"], version["withdrawn_by"]) == ("breaks NCCL", "operator")
    upgrade.refresh_from_db()
    assert (upgrade.state, upgrade.state_reason) == (UpgradeState.OFFBOARDED, "version withdrawn: breaks NCCL")
    assert second.status_code == 409
    assert second.json()["detail"] == "gpu-driver 560.35.03 is withdrawn: breaks NCCL"
    assert Upgrade.objects.filter(state=UpgradeState.ACTIVE).count() == 0


def test_components_versions_and_compatibility_rules_are_created_and_a_rule_removed(operator) -> None:
    job = operator.post("/api/components/", {"name": "cuda", "layer": "job_facing"}, format="json")
    low = operator.post("/api/components/", {"name": "nic-fw", "layer": "lower_level"}, format="json")
    added = operator.post(f"/api/components/{job.json()['id']}/versions/", {"version": "12.6"}, format="json")
    rule = {
        "job_facing_component": "cuda",
        "job_facing_version": "12.6",
        "lower_component": "nic-fw",
        "min_version": "22.1",
    }

    created = operator.post("/api/compatibility-rules/", rule, format="json")
    removed = operator.delete(f"/api/compatibility-rules/{created.json()['id']}/")

    assert (job.status_code, low.status_code, added.status_code, created.status_code) == (201, 201, 201, 201)
    assert [v["version"] for v in added.json()["versions"]] == ["12.6"]
    assert created.json()["min_version"] == "22.1"
    assert removed.status_code == 204
    assert not CompatibilityRule.objects.exists()
    assert [e.kind for e in Event.objects.filter(kind__startswith="compatibility_rule.").order_by("pk")] == [
        "compatibility_rule.created",
        "compatibility_rule.deleted",
    ]


def test_a_service_owner_places_their_own_service_and_another_owners_service_does_not_exist_for_them() -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=2)
    owner = make_user(Role.SERVICE_OWNER)
    mine, theirs = make_service(owners=[owner]), make_service(owners=[make_user(Role.SERVICE_OWNER)])
    service_place(service=mine, hosts=hosts[:1])
    client = token_client(owner)
    names = [h.hostname for h in hosts]

    placed = client.post(f"/api/services/{mine.pk}/placements/", {"hosts": names, "running_jobs": 3}, format="json")
    refused = client.post(f"/api/services/{theirs.pk}/placements/", {"hosts": names}, format="json")
    created = client.post("/api/services/", {"name": "mine-too"}, format="json")

    assert placed.status_code == 200, placed.content
    assert placed.json() == {"added": 1, "changed": 1, "removed": 0}
    assert refused.status_code == 404
    assert created.status_code == 403
    assert not theirs.placements.exists()
    removed = client.post(f"/api/services/{mine.pk}/placements/remove/", {"hosts": names[:1]}, format="json")
    assert removed.json() == {"added": 0, "changed": 0, "removed": 1}


def test_an_operator_creates_a_service_with_owners_and_changes_them(operator) -> None:
    alice, bob = make_user(Role.SERVICE_OWNER), make_user(Role.SERVICE_OWNER)

    created = operator.post("/api/services/", {"name": "trainer", "owners": [alice.username]}, format="json")
    changed = operator.patch(f"/api/services/{created.json()['id']}/", {"owners": [bob.username]}, format="json")
    unknown = operator.patch(f"/api/services/{created.json()['id']}/", {"owners": ["nobody"]}, format="json")

    assert created.status_code == 201, created.content
    assert changed.json()["owners"] == [bob.username]
    assert unknown.status_code == 400
    assert unknown.json()["errors"] == {"owners": ["No user nobody."]}


def test_a_reported_version_that_differs_is_drift_trains_see_it_and_a_matching_report_clears_it() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    host = hosts[0]
    executor = role_client(Role.EXECUTOR)
    path = f"/api/hosts/{host.hostname}/versions/"

    drift = executor.post(path, {"versions": {"bios": "2.16.0", "gpu-driver": "550.127.05"}}, format="json")

    assert drift.status_code == 200, drift.content
    assert drift.json()["drift"] is True
    assert {v["component"]: v["outcome"] for v in drift.json()["versions"]} == {
        "bios": "drift",
        "gpu-driver": "matches",
    }
    (event,) = events("host.version_drift")
    assert event.data == {"component": "bios", "believed": "2.14.0", "reported": "2.16.0"}
    assert InstalledVersion.objects.get(host=host, component__name="bios").version.version == "2.16.0"
    operator = role_client(Role.OPERATOR)
    assert [h["hostname"] for h in operator.get("/api/hosts/", {"drift": "true"}).json()["results"]] == [host.hostname]
    gauge = next(f for f in collect() if f.name == "opsplanner_hosts_with_version_drift")
    assert gauge.samples == [({"pool": pool.name}, 1)]

    cleared = executor.post(path, {"versions": {"bios": "2.16.0"}}, format="json")

    assert cleared.json()["versions"][0]["outcome"] == "drift_cleared"
    assert cleared.json()["drift"] is False
    assert operator.get("/api/hosts/", {"drift": "true"}).json()["results"] == []


def test_a_report_of_a_version_not_in_the_catalogue_is_refused_naming_the_component() -> None:
    _, hosts = make_fleet(domains=1, hosts_per_domain=1)

    response = role_client(Role.OPERATOR).post(
        f"/api/hosts/{hosts[0].pk}/versions/", {"versions": {"bios": "9.9", "psu": "1"}}, format="json"
    )

    assert response.status_code == 400
    assert set(response.json()["errors"]) == {"versions.bios", "versions.psu"}
    assert not events("host.version_drift")


def test_an_operator_releases_a_version_withdrawn_by_hand_and_a_second_release_is_refused(operator) -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="refresh")
    component = upgrade.component_version.component
    base = f"/api/components/{component.pk}/versions/560.35.03"
    operator.post(f"{base}/withdraw/", {"reason": "breaks NCCL"}, format="json")

    released = operator.post(f"{base}/release/", {"reason": "vendor fix verified"}, format="json")
    again = operator.post(f"{base}/release/", {"reason": "again"}, format="json")
    nameless = operator.post(f"{base}/release/", {"reason": " "}, format="json")

    assert released.status_code == 200, released.content
    version = next(v for v in released.json()["versions"] if v["version"] == "560.35.03")
    assert (version["withdrawn_at"], version["withdrawn_reason"], version["withdrawn_by"]) == (None, "", "")
    assert again.status_code == 409
    assert again.json()["detail"] == "gpu-driver 560.35.03 is not withdrawn."
    assert nameless.status_code == 400
    upgrade.refresh_from_db()
    assert upgrade.state == UpgradeState.OFFBOARDED  # re-onboarded on its own, by approval

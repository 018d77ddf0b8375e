"""The fleet file: applied like `kubectl apply` (plan, dry run, prune, one transaction, an event per
change), refused when it would touch live work, and exported back unchanged."""

from __future__ import annotations

import copy
import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from fleet.fleetfile import FleetApplyRefused, FleetFileInvalid, FleetPlan, fleet_apply
from fleet.fleetfile.export import fleet_export_document
from fleet.fleetfile.schema import fleet_spec_from_document, load_document
from fleet.models import (
    CompatibilityRule,
    ComponentVersion,
    Host,
    MaintenanceDomain,
    Pool,
    Service,
    ServicePlacement,
)
from fleet.models.hosts import RETIRED
from fleet.seeding import demo_fleet_seed
from fleet.selectors.capacity import pool_capacities, pool_capacity
from fleet.services import host_create
from opsplanner.models import Event
from opsplanner.selectors.invariants import check_invariants
from opsplanner.services.operations import operation_submit
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from trains.models import Upgrade, UpgradeState
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "fleet.yaml"
WRITES = ("INSERT", "UPDATE", "DELETE", "COPY")


def example() -> dict[str, Any]:
    return load_document(EXAMPLE.read_text())


def apply(document: dict[str, Any], **options: Any) -> FleetPlan:
    return fleet_apply(spec=fleet_spec_from_document(copy.deepcopy(document)), **options)


def run(*args: str) -> str:
    out = StringIO()
    call_command("fleet_apply", *args, stdout=out, stderr=out)
    return out.getvalue()


def host(hostname: str) -> Host:
    return Host.all_objects.get(hostname=hostname)


def writes_during(action: Any) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        action()
    return [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith(WRITES)]


# Applying -----------------------------------------------------------------------------------------


def test_applying_the_example_file_creates_everything_it_declares_with_an_event_per_change() -> None:
    output = run(str(EXAMPLE))

    assert "+ host trn-r0001-h01" in output
    assert "Applied 31 changes." in output
    assert sorted(Pool.objects.values_list("name", flat=True)) == ["ai-train-east", "web-central"]
    assert MaintenanceDomain.objects.count() == 3
    trn = host("trn-r0001-h01")
    assert (trn.pool.name, trn.domain.name, trn.sku, trn.gpu_count) == ("ai-train-east", "rack-0001", "gpu-h100-8x", 8)
    assert trn.labels == {"row": "a", "switch": "leaf-01", "slurm_node": "trn001"}
    pool = Pool.objects.get(name="ai-train-east")
    assert (pool.planned_buffer_hosts, str(pool.failure_buffer_fraction), pool.hard_floor_hosts) == (2, "0.1000", 3)
    withdrawn = ComponentVersion.objects.get(component__name="gpu-driver", version="560.28.03")
    assert withdrawn.withdrawn_at is not None
    assert withdrawn.withdrawn_reason.startswith("hangs under NCCL")
    assert CompatibilityRule.objects.count() == 2
    assert ServicePlacement.objects.get(host__hostname="web-a-01").running_jobs == 8
    assert Event.objects.filter(kind="host.created").count() == 6
    assert Event.objects.exclude(kind="fleet.applied").count() == 31
    assert Event.objects.filter(kind="fleet.applied").count() == 1


def test_applying_the_same_file_twice_writes_nothing_the_second_time() -> None:
    run(str(EXAMPLE))
    events = Event.objects.count()

    writes = writes_during(lambda: apply(example()))

    assert writes == []
    assert Event.objects.count() == events
    assert "Plan: no changes" in run(str(EXAMPLE))


def test_a_dry_run_prints_the_plan_and_writes_nothing() -> None:
    output = run(str(EXAMPLE), "--dry-run")

    assert "+ pool ai-train-east" in output
    assert "Plan (dry run): 31 to create" in output
    assert Pool.objects.count() == 0
    assert Host.all_objects.count() == 0
    assert Event.objects.count() == 0


def test_a_change_is_planned_with_its_fields_before_and_after() -> None:
    run(str(EXAMPLE))
    document = example()
    document["hosts"][1]["domain"] = "rack-0002"
    document["hosts"][1]["labels"]["switch"] = "leaf-02"

    plan = apply(document)

    (change,) = plan.changes
    assert change.line() == (
        '~ host trn-r0001-h02: domain rack-0001 -> rack-0002, labels {"row":"a","slurm_node":"trn002",'
        '"switch":"leaf-01"} -> {"row":"a","slurm_node":"trn002","switch":"leaf-02"}'
    )
    assert host("trn-r0001-h02").domain.name == "rack-0002"
    event = Event.objects.get(kind="host.updated")
    assert event.data["before"]["domain"] == "rack-0001"
    assert event.data["after"]["domain"] == "rack-0002"


def test_json_is_accepted_as_well_as_yaml(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps(example()))

    assert "Applied 31 changes." in run(str(path))


# Errors -------------------------------------------------------------------------------------------


def test_a_file_with_three_errors_lists_all_three_with_their_places_and_writes_nothing(tmp_path: Path) -> None:
    document = example()
    document["hosts"][3]["domain"] = "rack-99"
    document["hosts"][4]["gpu_count"] = 99
    document["pools"][1]["planned_buffer"] = 1.5
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(document))

    with pytest.raises(FleetFileInvalid) as raised:
        apply(document)
    with pytest.raises(CommandError, match="3 errors"):
        run(str(path))

    assert [str(p) for p in raised.value.problems] == [
        "pools[1].planned_buffer: a fraction must be at least 0 and below 1, not 1.5; give hosts as a whole number",
        "hosts[3].domain: no domain 'rack-99' in pool ai-train-east",
        "hosts[4].gpu_count: must be between 0 and 64, not 99",
    ]
    assert Pool.objects.count() == 0
    assert Event.objects.count() == 0


def test_owners_must_be_users_and_yaml_errors_name_their_line() -> None:
    document = example()
    document["services"][0]["owners"] = ["nobody-here"]

    with pytest.raises(FleetFileInvalid, match=r"services\[0\]\.owners\[0\]: no user 'nobody-here'"):
        apply(document)
    with pytest.raises(FleetFileInvalid, match=r"document: not valid YAML.*line 2"):
        load_document("pools:\n  - [unclosed\n")


# Prune and retired hosts --------------------------------------------------------------------------


def _without_host(document: dict[str, Any], hostname: str) -> dict[str, Any]:
    document = copy.deepcopy(document)
    document["hosts"] = [h for h in document["hosts"] if h["hostname"] != hostname]
    for service in document["services"]:
        service["placements"] = [
            p for p in service["placements"] if (p if isinstance(p, str) else p["host"]) != hostname
        ]
    return document


def test_without_prune_nothing_is_removed_and_with_prune_exactly_what_disappeared_is_retired() -> None:
    apply(example())
    smaller = _without_host(example(), "web-a-02")

    assert apply(smaller).changes == []
    plan = apply(smaller, prune=True)

    assert sorted(c.line() for c in plan.changes) == [
        "- host web-a-02 (retired)",
        "- placement web-frontend on web-a-02",
    ]
    assert host("web-a-02").state == RETIRED
    assert not Host.objects.filter(hostname="web-a-02").exists()  # gone from the live inventory
    assert Host.objects.count() == 5
    assert Event.objects.filter(kind="host.state_changed", data__to=RETIRED, host_id=host("web-a-02").pk).exists()
    assert apply(smaller, prune=True).changes == []


def test_a_retired_host_comes_back_in_service_when_a_later_file_names_it_again() -> None:
    apply(example())
    apply(_without_host(example(), "web-a-02"), prune=True)

    plan = apply(example())

    assert [c.line() for c in plan.of("host")] == ["~ host web-a-02: state retired -> in_service (restored)"]
    assert host("web-a-02").state == "in_service"
    assert Host.objects.filter(hostname="web-a-02").exists()


def test_a_retired_host_counts_in_no_buffer_and_gets_no_work() -> None:
    apply(example())
    apply(_without_host(example(), "web-a-02"), prune=True)
    pool = Pool.objects.get(name="web-central")

    capacity = pool_capacity(pool)
    assert (capacity.total, capacity.in_service, capacity.buffers.planned) == (1, 1, 0)
    assert [c.total for c in pool_capacities(pool_id=pool.pk)] == [1]
    operation = operation_submit(kind="reboot", scope="pool web-central", reason="kernel fix")
    assert list(operation.tasks.values_list("host__hostname", flat=True)) == ["web-a-01"]
    with pytest.raises(Exception, match="web-a-02"):
        operation_submit(kind="reboot", scope="hosts: web-a-02", reason="kernel fix")
    assert check_invariants() == []


# Safety against live work -------------------------------------------------------------------------


def test_a_host_under_a_lease_is_neither_moved_nor_retired_and_the_operation_is_named() -> None:
    pool, hosts = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=2)
    document = fleet_export_document(pool=pool.name)
    operation = operation_submit(kind="reboot", scope=f"hosts: {hosts[0].hostname}", reason="kernel fix")
    pool_tick(pool_id=pool.pk)
    moved = copy.deepcopy(document)
    moved["hosts"][0]["domain"] = "rack-0002"
    events = Event.objects.count()

    with pytest.raises(FleetApplyRefused) as refused:
        apply(moved)
    with pytest.raises(FleetApplyRefused) as retired:
        apply(_without_host(document, hosts[0].hostname), prune=True)

    held = f"it is held by operation #{operation.pk} (reboot: kernel fix)"
    assert refused.value.plan.refusals == [f"host {hosts[0].hostname}: not moved to domain rack-0002: {held}"]
    assert retired.value.plan.refusals == [f"host {hosts[0].hostname}: not retired: {held}"]
    assert host(hosts[0].hostname).domain.name == "rack-0001"
    assert Event.objects.count() == events


def test_a_host_named_by_an_open_operation_is_not_retired() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=1)
    document = fleet_export_document(pool=pool.name)
    operation = operation_submit(kind="reboot", scope=f"hosts: {hosts[1].hostname}", reason="later")

    with pytest.raises(FleetApplyRefused, match=f"named by open operation #{operation.pk}"):
        apply(_without_host(document, hosts[1].hostname), prune=True)


def test_lowering_a_buffer_below_what_is_out_now_is_refused_with_the_numbers() -> None:
    pool, _hosts = make_fleet(domains=2, hosts_per_domain=2, planned_buffer_hosts=2)
    document = fleet_export_document(pool=pool.name)
    operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="kernel fix")
    pool_tick(pool_id=pool.pk)  # two hosts draining: the planned buffer is full
    document["pools"][0]["planned_buffer"] = 1
    document["pools"][0]["hard_floor"] = 3

    with pytest.raises(FleetApplyRefused) as refused:
        apply(document)

    assert refused.value.plan.refusals == [
        f"pool {pool.name}: the planned buffer would be 1 hosts, below the 2 hosts out for planned work now",
        f"pool {pool.name}: the hard floor would be 3 hosts, above the 2 hosts in service now",
    ]
    assert Pool.objects.get(pk=pool.pk).planned_buffer_hosts == 2


def an_upgrade_and_a_file_withdrawing_its_version() -> tuple[Upgrade, dict[str, Any]]:
    """An upgrade of the GPU driver 560.35.03, and its pool's exported file that withdraws that version."""
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    upgrade = upgrade_create(pool=pool, component="gpu-driver", version="560.35.03", reason="refresh")
    document = fleet_export_document(pool=pool.name)
    driver = next(c for c in document["components"] if c["name"] == "gpu-driver")
    driver["versions"] = [
        v if v != "560.35.03" else {"version": v, "withdrawn": "breaks NCCL"} for v in driver["versions"]
    ]
    return upgrade, document


def test_a_version_withdrawn_by_the_file_offboards_its_pending_upgrades() -> None:
    upgrade, document = an_upgrade_and_a_file_withdrawing_its_version()

    plan = apply(document)

    assert [c.line() for c in plan.changes] == [
        f"~ version gpu-driver 560.35.03: withdrawn False -> True, withdrawn_reason none -> breaks NCCL "
        f"(offboards upgrade #{upgrade.pk})"
    ]
    upgrade.refresh_from_db()
    assert upgrade.state == UpgradeState.OFFBOARDED
    assert "breaks NCCL" in upgrade.state_reason
    assert ComponentVersion.objects.get(pk=upgrade.component_version_id).withdrawn_reason == "breaks NCCL"
    assert Upgrade.objects.filter(state=UpgradeState.ACTIVE).count() == 0
    assert apply(document).changes == []


# Export -------------------------------------------------------------------------------------------


def test_export_then_apply_changes_nothing_on_the_demo_fleet() -> None:
    demo_fleet_seed(hosts=200)
    events = Event.objects.count()
    document = load_document(_export())

    plan = apply(document, prune=True)

    assert plan.changes == []
    assert Event.objects.count() == events
    assert len(document["hosts"]) == 200
    assert Service.objects.count() == len(document["services"])


def _export(*args: str) -> str:
    out = StringIO()
    call_command("fleet_export", *args, stdout=out)
    return out.getvalue()


def test_export_of_one_pool_applies_back_unchanged_even_with_prune() -> None:
    pool, _ = make_fleet(domains=2, hosts_per_domain=2)
    make_fleet(domains=1, hosts_per_domain=2)

    document = load_document(_export("--pool", pool.name))

    assert [p["name"] for p in document["pools"]] == [pool.name]
    assert apply(document, prune=True).changes == []
    assert Host.objects.count() == 6


def test_an_idle_host_moves_to_another_pool_and_its_event_says_from_where() -> None:
    apply(example())
    document = example()
    document["hosts"][4].update(pool="ai-train-east", domain="rack-0002")

    plan = apply(document)

    assert [c.line() for c in plan.changes] == [
        "~ host web-a-01: pool web-central -> ai-train-east, domain row-a -> rack-0002"
    ]
    moved = host("web-a-01")
    assert (moved.pool.name, moved.domain.name) == ("ai-train-east", "rack-0002")
    event = Event.objects.get(kind="host.updated", host_id=moved.pk)
    assert event.data["before"] == {"pool": "web-central", "domain": "row-a"}
    assert event.pool_id == moved.pool_id


def test_a_version_yaml_reads_as_a_number_must_be_quoted() -> None:
    document = example()
    document["components"][0]["versions"] = [12.4]

    with pytest.raises(
        FleetFileInvalid, match=r"components\[0\]\.versions\[0\]: expected a string, got a number; quote"
    ):
        apply(document)


def test_a_file_releases_a_version_it_withdrew() -> None:
    apply(example())
    assert ComponentVersion.objects.get(version="560.28.03").withdrawn_by == "fleet_file"
    document = example()
    document["components"][1]["versions"][2] = "560.28.03"

    plan = apply(document)

    assert [c.line() for c in plan.changes] == [
        "~ version gpu-driver 560.28.03: withdrawn True -> False, withdrawn_reason hangs under NCCL all-reduce at 4k "
        "GPUs -> none"
    ]
    released = ComponentVersion.objects.get(version="560.28.03")
    assert (released.withdrawn_at, released.withdrawn_by, released.withdrawn_reason) == (None, "", "")


@pytest.mark.parametrize(
    ("withdrawn_by", "where"),
    [
        ("offboarding", "the offboarding of its upgrade withdrew it: re-onboard that upgrade (an approval)"),
        ("operator", "an operator withdrew it: release it through the API (versions/…/release/)"),
    ],
)
def test_a_file_does_not_release_a_version_withdrawn_elsewhere_and_says_where_it_is(
    withdrawn_by: str, where: str
) -> None:
    apply(example())
    ComponentVersion.objects.filter(version="560.28.03").update(withdrawn_by=withdrawn_by)
    document = example()
    document["components"][1]["versions"][2] = "560.28.03"

    with pytest.raises(FleetApplyRefused) as refused:
        apply(document)

    assert refused.value.plan.refusals == [
        "version gpu-driver 560.28.03: withdrawn (hangs under NCCL all-reduce at 4k GPUs); a file releases only "
        f"what it withdrew: {where}, or keep it withdrawn in the file"
    ]
    assert ComponentVersion.objects.get(version="560.28.03").withdrawn_at is not None


def test_a_new_host_may_not_take_the_name_of_a_retired_one() -> None:
    apply(example())
    apply(_without_host(example(), "web-a-02"), prune=True)

    with pytest.raises(ValidationError, match="A retired host is named web-a-02"):
        host_create(hostname="web-a-02", domain=MaintenanceDomain.objects.get(name="row-a"), sku="cpu-epyc-2s")


def test_an_upgrade_the_file_offboarded_is_not_re_onboarded_while_the_file_keeps_its_version_withdrawn() -> None:
    from tests.trains_builders import make_user
    from trains.services.reonboarding import upgrade_reonboard_request

    upgrade, document = an_upgrade_and_a_file_withdrawing_its_version()
    apply(document)

    with pytest.raises(ValidationError) as refused:
        upgrade_reonboard_request(upgrade_id=upgrade.pk, reason="the vendor fixed it", actor=make_user())

    assert refused.value.messages == [
        "gpu-driver 560.35.03 is withdrawn (breaks NCCL) and re-onboarding does not release it: the fleet file "
        "withdrew it: release it in the file (drop its `withdrawn`), then re-onboard."
    ]
    assert Upgrade.objects.get(pk=upgrade.pk).state == UpgradeState.OFFBOARDED

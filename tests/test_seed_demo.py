"""seed_demo builds a believable fleet, and a second run changes nothing."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.db.models import Count

from fleet import demo
from fleet.models import (
    CompatibilityRule,
    Component,
    ComponentLayer,
    ComponentVersion,
    Host,
    InstalledVersion,
    MaintenanceDomain,
    OptOutWindow,
    Pool,
    Service,
    ServicePlacement,
)
from opsplanner.models import Event

pytestmark = pytest.mark.django_db

SEEDED_MODELS = [
    Pool,
    MaintenanceDomain,
    Host,
    Component,
    ComponentVersion,
    InstalledVersion,
    CompatibilityRule,
    Service,
    ServicePlacement,
    OptOutWindow,
    Event,
]


def seed(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("seed_demo", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def snapshot() -> dict[str, list[tuple]]:
    return {model.__name__: list(model.objects.order_by("pk").values_list()) for model in SEEDED_MODELS}


def test_it_builds_pools_racks_hosts_versions_and_services_in_the_right_numbers() -> None:
    out, err = seed("--hosts", "1000")
    per_pool = demo.hosts_per_pool(1000)
    assert sum(per_pool.values()) == 1000
    counts = dict(Host.objects.values("pool__name").annotate(n=Count("id")).values_list("pool__name", "n"))
    assert counts == per_pool
    assert set(Pool.objects.values_list("workload_class", flat=True)) == {
        "ai_training",
        "ai_inference",
        "web",
        "storage",
    }
    for plan in demo.POOLS:
        racks = MaintenanceDomain.objects.filter(pool__name=plan.name).count()
        assert racks == -(-per_pool[plan.name] // plan.hosts_per_rack)
        components_per_host = len(plan.pinned) + len(plan.sliding)
        installed = InstalledVersion.objects.filter(host__pool__name=plan.name).count()
        assert installed == per_pool[plan.name] * components_per_host
    assert Component.objects.filter(layer=ComponentLayer.JOB_FACING).get().name == "cuda-runtime"
    assert ServicePlacement.objects.count() == 1000
    assert OptOutWindow.objects.count() == len(demo.OPTOUT_WINDOWS)
    assert Host.objects.filter(pool__name="ai-train-east").exclude(gpu_count=8).count() == 0
    assert "hosts 1,000" in out
    assert "seed_demo: ai-train-east hosts 400/400 (100%)" in err  # progress is shown
    assert Event.objects.filter(kind="fleet.seeded").count() == 1


def test_a_second_run_changes_nothing() -> None:
    seed("--hosts", "600")
    before = snapshot()
    out, _ = seed("--hosts", "600")
    assert out.strip() == "seed_demo: nothing to do"
    assert snapshot() == before


def test_a_larger_second_run_adds_the_missing_hosts_and_keeps_the_others() -> None:
    seed("--hosts", "200")
    first_hosts = dict(Host.objects.values_list("hostname", "domain_id"))
    seed("--hosts", "400")
    assert Host.objects.count() == 400
    assert {
        name: domain for name, domain in Host.objects.values_list("hostname", "domain_id") if name in first_hosts
    } == (first_hosts)


def test_with_if_empty_it_leaves_an_existing_fleet_alone() -> None:
    seed("--hosts", "100")
    out, _ = seed("--hosts", "500", "--if-empty")
    assert "leaving it alone" in out
    assert Host.objects.count() == 100


@pytest.mark.parametrize("hosts", ["0", "3", "1000001"])
def test_it_refuses_a_host_count_out_of_range_and_writes_nothing(hosts: str) -> None:
    with pytest.raises(CommandError, match="--hosts must be between 4 and 1,000,000"):
        seed("--hosts", hosts)
    assert not Pool.objects.exists()


def test_a_rack_gets_the_same_versions_whatever_the_fleet_size() -> None:
    plan = demo.POOLS[0]
    assert demo.rack_versions(plan, 7, seed=42) == demo.rack_versions(plan, 7, seed=42)
    several = {tuple(sorted(demo.rack_versions(plan, rack, seed=42).items())) for rack in range(1, 60)}
    assert len(several) > 1  # sliding upgrades left racks at different versions


def test_hosts_are_split_by_share_with_at_least_one_per_pool() -> None:
    assert demo.hosts_per_pool(4) == {plan.name: 1 for plan in demo.POOLS}
    split = demo.hosts_per_pool(100_000)
    assert split == {"ai-train-east": 40_000, "ai-infer-west": 25_000, "web-central": 20_000, "storage-north": 15_000}

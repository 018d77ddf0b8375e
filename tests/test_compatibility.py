"""Hosts whose lower-level versions do not work with their pinned job-facing version are found."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from fleet import services
from fleet.models import ComponentLayer, ComponentVersion, Host
from fleet.seeding import demo_fleet_seed
from fleet.selectors.compatibility import PlannedHosts, host_incompatibilities, hosts_incompatibilities
from opsplanner.models import WaitingCode
from opsplanner.progress import Progress
from opsplanner.services.compatibility import Refusal, target_refusal
from opsplanner.services.operations import operation_submit
from tests.builders import make_component, make_fleet, make_host, make_version
from trains.services.upgrades import upgrade_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def cuda_and_driver():
    cuda = make_component(ComponentLayer.JOB_FACING, name="cuda")
    driver = make_component(name="driver")
    cuda_124 = make_version(cuda, "12.4.1")
    services.compatibility_rule_create(job_facing_version=cuda_124, lower_component=driver, min_version="550.54.14")
    return cuda_124, driver


def test_a_driver_below_the_minimum_of_the_pinned_cuda_runtime_is_reported(cuda_and_driver) -> None:
    cuda_124, driver = cuda_and_driver
    good, bad = make_host(), make_host()
    for host, driver_version in ((good, "560.35.03"), (bad, "535.183.01")):
        services.installed_version_set(host=host, version=cuda_124)
        services.installed_version_set(host=host, version=make_version(driver, driver_version))
    problems = host_incompatibilities([good.pk, bad.pk])
    assert list(problems) == [bad.pk]
    assert problems[bad.pk] == ["driver 535.183.01 does not work with cuda 12.4.1 (needs [550.54.14, any])"]


def test_a_host_missing_a_constrained_component_is_reported(cuda_and_driver) -> None:
    cuda_124, _ = cuda_and_driver
    host = make_host()
    services.installed_version_set(host=host, version=cuda_124)
    assert "the host has none installed" in host_incompatibilities([host.pk])[host.pk][0]


def test_any_of_several_ranges_for_the_same_pair_is_enough(cuda_and_driver) -> None:
    cuda_124, driver = cuda_and_driver
    services.compatibility_rule_create(
        job_facing_version=cuda_124, lower_component=driver, min_version="535.100", max_version="535.200"
    )
    host = make_host()
    services.installed_version_set(host=host, version=cuda_124)
    services.installed_version_set(host=host, version=make_version(driver, "535.183.01"))
    assert host_incompatibilities([host.pk]) == {}


def test_a_planned_job_facing_version_is_checked_against_the_lower_versions_the_hosts_run(cuda_and_driver) -> None:
    cuda_124, driver = cuda_and_driver
    cuda = cuda_124.component
    host = make_host()
    services.installed_version_set(host=host, version=make_version(cuda, "12.2.0"))  # pins nothing
    services.installed_version_set(host=host, version=make_version(driver, "535.183.01"))
    assert host_incompatibilities([host.pk]) == {}
    assert host_incompatibilities([host.pk], planned=[cuda_124]) == {
        host.pk: ["driver 535.183.01 does not work with cuda 12.4.1 (needs [550.54.14, any])"]
    }


def test_it_reads_only_the_lower_components_a_pinned_rule_names(cuda_and_driver, django_assert_num_queries) -> None:
    cuda_124, driver = cuda_and_driver
    host = make_host()
    services.installed_version_set(host=host, version=make_version(driver, "560.35.03"))
    for name in ("bios", "nic-firmware", "bmc"):
        services.installed_version_set(host=host, version=make_version(make_component(name=name), "1.0"))
    with django_assert_num_queries(1):  # the job-facing versions: none, so no rule and nothing more to read
        assert host_incompatibilities([host.pk]) == {}
    services.installed_version_set(host=host, version=cuda_124)
    with django_assert_num_queries(3) as captured:
        assert host_incompatibilities([host.pk]) == {}
    lower = captured.captured_queries[-1]["sql"]  # the third reads the one component the rule names
    assert f""""fleet_installedversion"."component_id" = ANY('{{{driver.pk}}}'::bigint[])""" in lower, lower


def test_several_targets_are_checked_at_once_each_on_its_own_hosts(cuda_and_driver, django_assert_num_queries) -> None:
    cuda_124, driver = cuda_and_driver
    first, second = make_host(), make_host()
    current = make_version(driver, "560.35.03")
    for host in (first, second):
        services.installed_version_set(host=host, version=cuda_124)
        services.installed_version_set(host=host, version=current)
    too_old, newer = make_version(driver, "535.183.01"), make_version(driver, "570.86.10")
    unpinning = make_version(cuda_124.component, "12.2.0")
    groups = [
        PlannedHosts([first.pk, second.pk], [too_old]),
        PlannedHosts([first.pk], [newer]),
        PlannedHosts([second.pk], [unpinning, too_old]),  # 12.2 pins nothing: the old driver is fine there
    ]
    with django_assert_num_queries(3):  # not three per target
        results = hosts_incompatibilities(groups)
    reason = "driver 535.183.01 does not work with cuda 12.4.1 (needs [550.54.14, any])"
    assert results == [{first.pk: [reason], second.pk: [reason]}, {}, {}]
    assert results[0] == host_incompatibilities([first.pk, second.pk], planned=[too_old])


def test_the_demo_fleet_is_entirely_compatible() -> None:
    demo_fleet_seed(hosts=300, progress=Progress("test", stream=open("/dev/null", "w")))  # noqa: SIM115
    assert host_incompatibilities(Host.objects.values_list("pk", flat=True)) == {}


def test_a_target_that_keeps_every_rule_is_not_refused() -> None:
    _pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    newer = ComponentVersion.objects.get(component__name="gpu-driver", version="560.35.03")
    assert target_refusal([h.pk for h in hosts], newer) is None


def test_a_target_that_breaks_a_rule_is_refused_with_a_code_naming_a_host_and_the_rule() -> None:
    _pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    older = ComponentVersion.objects.get(component__name="gpu-driver", version="535.183.01")

    refusal = target_refusal([h.pk for h in hosts], older)

    assert refusal in {
        Refusal(
            code=WaitingCode.INCOMPATIBLE.value,
            message=f"gpu-driver 535.183.01 would break a compatibility rule on 2 of 2 hosts, e.g. {host.hostname}: "
            "gpu-driver 535.183.01 does not work with cuda-runtime 12.4.1 (needs [550.54.14, any]).",
        )
        for host in hosts
    }


def test_an_operation_and_an_upgrade_to_an_incompatible_target_are_refused_alike() -> None:
    pool, hosts = make_fleet(domains=1, hosts_per_domain=2)
    older = ComponentVersion.objects.get(component__name="gpu-driver", version="535.183.01")
    refusal = target_refusal([h.pk for h in hosts], older)
    assert refusal is not None

    with pytest.raises(ValidationError) as operation:
        operation_submit(
            kind="upgrade", scope=f"pool {pool.name}", reason="r", component="gpu-driver", version="535.183.01"
        )
    with pytest.raises(ValidationError) as upgrade:
        upgrade_create(pool=pool, component="gpu-driver", version="535.183.01", reason="r")

    assert operation.value.message_dict == {"component_version": [refusal.message]}
    assert upgrade.value.message_dict == {"version": [refusal.message]}
    assert operation.value.error_dict["component_version"][0].code == WaitingCode.INCOMPATIBLE
    assert upgrade.value.error_dict["version"][0].code == WaitingCode.INCOMPATIBLE

"""Every API list issues a fixed number of queries whatever its page size (pinned here)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from fleet.models import (
    CapacityReservation,
    CompatibilityRule,
    Component,
    ComponentLayer,
    ComponentVersion,
    Host,
    MaintenanceDomain,
    OptOutWindow,
    Pool,
    Service,
    ServicePlacement,
)
from fleet.versions import version_sort_key
from opsplanner import clock
from opsplanner.models import Approval, ApprovalKind, Event, HostTask, Operation, WorkItem
from opsplanner.roles import Role
from tests.api_helpers import token_client
from tests.trains_builders import make_user
from trains.models import Cycle, Train, TrainStop, Upgrade, UpgradePhase, Visit
from trains.selectors_forecast import FORECAST_QUERIES

pytestmark = pytest.mark.django_db

FAST_HASHER = ["django.contrib.auth.hashers.MD5PasswordHasher"]


ROWS = 51  # more than the larger page, so both pages are full


class Crowd:
    """ROWS rows behind every list endpoint, with their relations filled in (a relation read lazily
    would show up as one more query per row). Written in bulk: these tests read, they do not plan."""

    def __init__(self) -> None:
        self.owner = make_user(Role.SERVICE_OWNER)
        now = clock.now()
        n = range(ROWS)
        pools = Pool.objects.bulk_create(
            Pool(name=f"crowd-{i}", workload_class="ai_training", planned_buffer_hosts=1, failure_buffer_hosts=0)
            for i in n
        )
        domains = MaintenanceDomain.objects.bulk_create(MaintenanceDomain(pool=pool, name="rack-1") for pool in pools)
        hosts = Host.objects.bulk_create(
            Host(hostname=f"crowd-host-{i}", pool=pools[i], domain=domains[i], sku="gpu-h100-8x") for i in n
        )
        components = Component.objects.bulk_create(
            Component(name=f"crowd-fw-{i}", display_name=f"firmware {i}", layer=ComponentLayer.LOWER_LEVEL) for i in n
        )
        versions = ComponentVersion.objects.bulk_create(
            ComponentVersion(component=component, version=version, sort_key=version_sort_key(version))
            for component in components
            for version in ("1.0", "2.0")
        )
        job_facing = Component.objects.create(name="crowd-cuda", display_name="cuda", layer=ComponentLayer.JOB_FACING)
        cuda = ComponentVersion.objects.create(component=job_facing, version="12.4", sort_key=version_sort_key("12.4"))
        CompatibilityRule.objects.bulk_create(
            CompatibilityRule(job_facing_version=cuda, lower_component=component) for component in components
        )
        services = Service.objects.bulk_create(Service(name=f"crowd-svc-{i}", display_name=f"svc {i}") for i in n)
        Service.owners.through.objects.bulk_create(
            Service.owners.through(service_id=service.pk, user_id=self.owner.pk) for service in services
        )
        ServicePlacement.objects.bulk_create(ServicePlacement(service=services[i], host=hosts[i]) for i in n)
        window = {"starts_at": now, "ends_at": now + dt.timedelta(days=1), "reason": "r", "created_by": self.owner}
        OptOutWindow.objects.bulk_create(OptOutWindow(service=service, **window) for service in services)
        CapacityReservation.objects.bulk_create(
            CapacityReservation(service=services[i], pool=pools[i], min_hosts_in_service=1, **window) for i in n
        )
        operations = Operation.objects.bulk_create(
            Operation(kind="upgrade", component_version=versions[2 * i + 1], scope="pool", requester="op", reason="r")
            for i in n
        )
        tasks = HostTask.objects.bulk_create(
            HostTask(operation=operations[i], host=hosts[i], pool_id=pools[i].pk, priority=100) for i in n
        )
        WorkItem.objects.bulk_create(
            WorkItem(kind="drain", host=hosts[i], host_task=tasks[i], pool_id=pools[i].pk, adapter="external")
            for i in n
        )
        Approval.objects.bulk_create(
            Approval(
                kind=ApprovalKind.EMERGENCY_TRAIN,
                subject_type="trains.train",
                subject_id=i,
                requester="op",
                reason="r",
                requested_by=self.owner,
                expires_at=now + dt.timedelta(days=1),
            )
            for i in n
        )
        Event.objects.bulk_create(
            Event(kind="host.created", actor="crowd", subject_type="fleet.host", subject_id=host.pk) for host in hosts
        )
        trains = Train.objects.bulk_create(
            Train(name=f"crowd-train-{i}", pool=pools[i], cycle_slo_s=86400, visit_estimate_s=3600) for i in n
        )
        TrainStop.objects.bulk_create(TrainStop(train=trains[i], domain=domains[i], position=0) for i in n)
        cycles = Cycle.objects.bulk_create(
            Cycle(train=train, number=1, deadline_at=now + dt.timedelta(days=1)) for train in trains
        )
        Visit.objects.bulk_create(Visit(train=trains[i], cycle=cycles[i], domain=domains[i], position=0) for i in n)
        upgrades = Upgrade.objects.bulk_create(
            Upgrade(pool=pools[i], component_version=versions[2 * i + 1], scope="pool", reason="r", requester="op")
            for i in n
        )
        UpgradePhase.objects.bulk_create(
            UpgradePhase(upgrade=upgrade, position=0, name="all", percent=100) for upgrade in upgrades
        )


@pytest.fixture(scope="class")
def crowd(django_db_setup, django_db_blocker) -> Iterator[Crowd]:
    """Built once for the class, in a transaction rolled back after it."""
    with django_db_blocker.unblock(), override_settings(PASSWORD_HASHERS=FAST_HASHER), transaction.atomic():
        yield Crowd()
        transaction.set_rollback(True)


# Every request authenticates in 2 queries (the token with its user, the user's roles; expired
# tokens are swept by housekeeping, not per request). Then a limit/offset list counts (1) and reads its page (1); a
# cursor list reads its page only (1); prefetches and the operations' task counts add 1 each.
AUTH = 2
LIMIT_OFFSET = AUTH + 2
CURSOR = AUTH + 1
# list endpoint -> (the page-size parameter, the queries it issues whatever the page size)
LIST_QUERIES = {
    "pools": ("limit", LIMIT_OFFSET),
    "domains": ("limit", LIMIT_OFFSET),
    "hosts": ("page_size", CURSOR),
    "components": ("limit", LIMIT_OFFSET + 1),  # versions
    "compatibility-rules": ("limit", LIMIT_OFFSET),
    "services": ("limit", LIMIT_OFFSET + 1),  # owners
    "optout-windows": ("limit", LIMIT_OFFSET),
    "reservations": ("limit", LIMIT_OFFSET),
    "operations": ("limit", LIMIT_OFFSET + 2),  # host tasks by state, resubmissions
    "host-tasks": ("page_size", CURSOR),
    "work-items": ("page_size", CURSOR),
    "approvals": ("limit", LIMIT_OFFSET),
    "events": ("page_size", CURSOR),
    "trains": ("limit", LIMIT_OFFSET + 1),  # stops
    "visits": ("limit", LIMIT_OFFSET),
    "upgrades": ("limit", LIMIT_OFFSET + 1 + FORECAST_QUERIES),  # phases, the forecast
}


class TestListQueryCounts:
    @pytest.mark.parametrize("endpoint", list(LIST_QUERIES))
    def test_a_list_issues_the_same_pinned_number_of_queries_for_a_small_and_a_large_page(
        self, crowd: Crowd, endpoint: str
    ) -> None:
        parameter, pinned = LIST_QUERIES[endpoint]
        client = token_client(make_user(Role.OPERATOR))
        counts = {}
        for size in (5, 50):
            with CaptureQueriesContext(connection) as queries:
                response = client.get(f"/api/{endpoint}/", {parameter: size})
            assert response.status_code == 200, response.content
            assert len(response.json()["results"]) == size
            counts[size] = len(queries)
        assert counts == {5: pinned, 50: pinned}

    def test_a_service_owners_window_lists_issue_a_pinned_number_of_queries_for_any_page(self, crowd: Crowd) -> None:
        client = token_client(crowd.owner)
        for endpoint in ("optout-windows", "reservations"):
            counts = {}
            for size in (5, 50):
                with CaptureQueriesContext(connection) as queries:
                    response = client.get(f"/api/{endpoint}/", {"limit": size})
                assert len(response.json()["results"]) == size
                counts[size] = len(queries)
            assert counts == {5: LIMIT_OFFSET + 1, 50: LIMIT_OFFSET + 1}, endpoint  # + the services they own

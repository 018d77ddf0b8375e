"""Gantt render time: the page at /gantt/ for 2,000 hosts (2 pools, 100 domains of 20) over 7 days,
rows collapsed to domains, with a week of history (a train visit per domain per day, each with one
upgrade task per host: 700 visits, 14,000 host tasks), a train forecast ahead of now, opt-out
windows and reservations. Measured through Django's test client in this process (URL routing,
middleware, session, the view, the templates), so it is the server's time without the network.

Target: under 300 ms.
"""

from __future__ import annotations

import datetime as dt
import statistics
import time

from bench.common import Figure

POOLS = 2
HOSTS_PER_POOL = 1_000
HOSTS_PER_DOMAIN = 20
DAYS = 7
RENDERS = 30


def _history(now: dt.datetime) -> None:
    """A week of daily visits per domain, one upgrade operation per visit, a task per host."""
    from fleet.models import ComponentLayer, Host, MaintenanceDomain, Pool, Service, ServicePlacement
    from fleet.services import component_create, component_version_create, optout_window_create, reservation_create
    from opsplanner.bulk import insert_missing
    from opsplanner.models import HostTask, Operation, OperationKind, OperationSource, OperationState, TaskState
    from trains.models import Cycle, Visit, VisitOperation, VisitState
    from trains.services.trains import train_create
    from trains.services.upgrades import upgrade_create

    component = component_create(name="nic-firmware", layer=ComponentLayer.LOWER_LEVEL)
    target = component_version_create(component=component, version="22.4")
    for pool in Pool.objects.order_by("name"):
        train = train_create(pool=pool, name=f"train-{pool.name}", cycle_slo_s=86_400, visit_estimate_s=600)
        upgrade = upgrade_create(pool=pool, component="nic-firmware", version="22.4", reason="bench")
        domains = list(MaintenanceDomain.objects.filter(pool=pool).order_by("position"))
        hosts_of: dict[int, list[int]] = {}
        for host_id, domain_id in Host.objects.filter(pool=pool).values_list("id", "domain_id"):
            hosts_of.setdefault(domain_id, []).append(host_id)
        for day in range(DAYS, 0, -1):
            started = now - dt.timedelta(days=day)
            cycle = Cycle.objects.create(
                train=train, number=DAYS - day + 1, started_at=started, deadline_at=started + dt.timedelta(days=1),
                ended_at=started + dt.timedelta(hours=20),
            )  # fmt: skip
            visits, operations = [], []
            for i, domain in enumerate(domains):
                begin = started + dt.timedelta(minutes=12 * i)
                visits.append(
                    Visit(
                        train=train, cycle=cycle, domain=domain, position=i, state=VisitState.DONE,
                        started_at=begin, ended_at=begin + dt.timedelta(minutes=10),
                        plan={"hosts": hosts_of[domain.pk], "upgrades": [{"target": str(target), "hosts": 20}]},
                    )
                )  # fmt: skip
                operations.append(
                    Operation(
                        kind=OperationKind.UPGRADE, component_version=target, scope=f"domain {pool.name}/{domain.name}",
                        source=OperationSource.TRAIN, requester="bench", reason="bench", state=OperationState.COMPLETED,
                        created_at=begin, closed_at=begin + dt.timedelta(minutes=10),
                    )
                )  # fmt: skip
            Visit.objects.bulk_create(visits)
            Operation.objects.bulk_create(operations)
            VisitOperation.objects.bulk_create(
                [
                    VisitOperation(visit=v, upgrade=upgrade, operation=o, phase=0)
                    for v, o in zip(visits, operations, strict=True)
                ]
            )
            insert_missing(
                HostTask,
                ["operation_id", "host_id", "pool_id", "priority", "state", "created_at", "admitted_at",
                 "finished_at", "state_changed_at", "waiting_code", "waiting_reason", "failure_reason", "drain_key"],
                [
                    (o.pk, host_id, pool.pk, 200, TaskState.DONE, o.created_at, o.created_at,
                     o.closed_at, o.closed_at, "", "", "", None)
                    for v, o in zip(visits, operations, strict=True)
                    for host_id in hosts_of[v.domain_id]
                ],
            )  # fmt: skip
        service = Service.objects.create(name=f"svc-{pool.name}", display_name="bench")
        ServicePlacement.objects.bulk_create(
            [ServicePlacement(service=service, host_id=h) for h in hosts_of[domains[0].pk] + hosts_of[domains[5].pk]]
        )
        optout_window_create(
            service=service, starts_at=now, ends_at=now + dt.timedelta(hours=8), reason="launch", actor="bench"
        )
        reservation_create(
            service=service, pool=pool, min_hosts_in_service=900, starts_at=now - dt.timedelta(days=1),
            ends_at=now + dt.timedelta(days=1), reason="peak", actor="bench",
        )  # fmt: skip


def run(seconds: float | None = None) -> list[Figure]:
    import os

    from bench.setup import django_on_scratch_database

    os.environ.setdefault("ALLOWED_HOSTS", "localhost")  # DEBUG is off in benchmarks

    django_on_scratch_database("bench_gantt")
    from django.contrib.auth.models import User
    from django.test import Client

    from bench.fleet import bench_fleet
    from opsplanner import clock
    from opsplanner.models import HostTask
    from trains.models import Visit

    now = clock.now()
    bench_fleet(pools=POOLS, hosts_per_pool=HOSTS_PER_POOL, hosts_per_domain=HOSTS_PER_DOMAIN, planned_fraction="0.05")
    _history(now)
    user = User.objects.create_superuser("bench-viewer", password="x")
    client = Client()
    client.force_login(user)
    start = (now - dt.timedelta(days=DAYS - 1)).strftime("%Y-%m-%dT%H:%M")
    end = (now + dt.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    url = f"/gantt/?start={start}&end={end}"
    first = client.get(url, HTTP_HOST="localhost")
    if first.status_code != 200 or first.content.count(b'class="bar visit visit-done"') < 600:
        raise SystemExit(f"the Gantt did not draw the week: {first.status_code}")
    timings = []
    for _ in range(RENDERS):
        started = time.perf_counter()
        response = client.get(url, HTTP_HOST="localhost")
        timings.append(time.perf_counter() - started)
        assert response.status_code == 200
    timings.sort()
    how = (
        f"python -m bench gantt ({POOLS * HOSTS_PER_POOL:,} hosts, {Visit.objects.count():,} visits, "
        f"{HostTask.objects.count():,} host tasks, {DAYS} days, rows collapsed; {RENDERS} renders)"
    )
    return [
        Figure("gantt_render_2k_hosts_7d_p50_ms", round(statistics.median(timings) * 1000, 1), "ms", how),
        Figure("gantt_render_2k_hosts_7d_p95_ms", round(timings[int(0.95 * (len(timings) - 1))] * 1000, 1), "ms", how),
        Figure("gantt_page_kib", round(len(first.content) / 1024, 1), "KiB", how + "; size of the HTML"),
    ]

"""Long-polling claims share one watcher per process: a waiting claim holds no database connection,
and only the claims whose work became ready wake up."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from fleet.models import Host
from opsplanner.models import WorkItem, WorkState
from opsplanner.services.operations import operation_submit
from opsplanner.services.ready_watch import ReadyFilter, ready_among, watcher
from opsplanner.services.tick import pool_tick
from opsplanner.services.work_items import work_item_report, work_items_claim, work_items_claim_waiting
from tests.builders import make_fleet
from tests.driving import in_threads


def _external_reboot(hosts: int):  # type: ignore[no-untyped-def]
    pool, _ = make_fleet(domains=1, hosts_per_domain=hosts, planned_buffer_hosts=hosts)
    operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="r", drainer="external", executor="external")
    pool_tick(pool_id=pool.pk)
    return pool


def _other_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        (count,) = cursor.fetchone()
    return int(count)


@pytest.mark.django_db
def test_it_tells_which_waiting_claims_have_a_ready_item() -> None:
    pool = _external_reboot(2)
    other, _ = make_fleet(domains=1, hosts_per_domain=1)
    first, second = Host.objects.filter(pool=pool).order_by("id").values_list("id", flat=True)
    work_items_claim(worker="w", host_id=second, limit=5)  # only the first host's drain stays ready
    wanted = {
        "host's drain": ReadyFilter("external", frozenset({"drain"}), None, first),
        "host, any kind": ReadyFilter("external", frozenset(), pool.pk, first),
        "host's execute": ReadyFilter("external", frozenset({"execute"}), None, first),
        "claimed host": ReadyFilter("external", frozenset(), None, second),
        "pool": ReadyFilter("external", frozenset(), pool.pk, None),
        "any pool, drains": ReadyFilter("external", frozenset({"drain", "undrain"}), None, None),
        "other pool": ReadyFilter("external", frozenset(), other.pk, None),
        "other adapter": ReadyFilter("slurm", frozenset(), None, None),
    }
    found = ready_among(wanted.values())
    assert sorted(name for name, w in wanted.items() if w in found) == [
        "any pool, drains",
        "host's drain",
        "host, any kind",
        "pool",
    ]


@pytest.mark.django_db(transaction=True)
def test_waiting_claims_hold_no_connection_and_only_the_one_whose_work_is_ready_wakes() -> None:
    hosts = 30
    pool = _external_reboot(hosts)
    drains = work_items_claim(worker="drainer", kinds=["drain"], pool_id=pool.pk, limit=hosts)
    assert len(drains) == hosts
    answers: dict[int, tuple[float, list[WorkItem]]] = {}
    started = time.monotonic()

    def wait_for_execute(host_id: int):  # type: ignore[no-untyped-def]
        def target() -> None:
            items = work_items_claim_waiting(worker=f"agent-{host_id}", wait_seconds=4, host_id=host_id, limit=1)
            answers[host_id] = (time.monotonic() - started, items)

        return target

    waiting = threading.Thread(target=lambda: in_threads(*(wait_for_execute(d.host_id) for d in drains)))
    waiting.start()
    deadline = time.monotonic() + 10
    while watcher.waiting() < hosts and time.monotonic() < deadline:
        time.sleep(0.05)
    assert watcher.waiting() == hosts
    assert _other_connections() <= 1  # the watcher's own, not one per waiting claim

    drained = drains[0]
    work_item_report(item_id=drained.pk, worker="drainer", key="k", outcome="done", attempt=drained.attempts)
    pool_tick(pool_id=pool.pk)  # the first host's execute item becomes ready
    waiting.join(timeout=30)

    woke_at, (item,) = answers.pop(drained.host_id)
    assert (item.kind, item.state, item.claimed_by) == ("execute", WorkState.RUNNING, f"agent-{drained.host_id}")
    assert woke_at < 3.5
    assert len(answers) == hosts - 1
    assert all(items == [] and at >= 4 for at, items in answers.values())
    assert watcher.waiting() == 0

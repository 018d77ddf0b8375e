"""Invariants 1-4 under concurrency: real threads, each with its own PostgreSQL connection."""

from __future__ import annotations

import random
import threading
import time

import pytest
from django.db import transaction

from fleet.models import Host, HostState, Pool
from opsplanner.models import HostTask, Lease, TaskState
from opsplanner.selectors.invariants import check_invariants
from opsplanner.services.escalations import host_escalation_release
from opsplanner.services.operation_cancel import operation_cancel
from opsplanner.services.operations import operation_submit
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from tests.builders import make_fleet
from tests.driving import ACTIVE, drive, in_threads, instant_simulator

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_second_tick_of_a_locked_pool_skips_it() -> None:
    pool, _ = make_fleet(domains=1, hosts_per_domain=2)
    operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="r")
    locked, release = threading.Event(), threading.Event()
    reports = []

    def hold_the_pool() -> None:
        with transaction.atomic():
            Pool.objects.select_for_update().get(pk=pool.pk)
            locked.set()
            release.wait(30)

    def tick_meanwhile() -> None:
        locked.wait(30)
        reports.append(pool_tick(pool_id=pool.pk))
        release.set()

    assert in_threads(hold_the_pool, tick_meanwhile) == []
    assert reports[0].skipped
    assert not HostTask.objects.exclude(state=TaskState.PENDING).exists()


def test_ticks_racing_on_one_pool_never_admit_twice() -> None:
    instant_simulator()
    pool, _hosts = make_fleet(domains=2, hosts_per_domain=6, planned_buffer_hosts=4)
    operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="a", priority=10)
    operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="b", priority=20)
    barrier = threading.Barrier(4)

    def ticker() -> None:
        barrier.wait()
        for _ in range(15):
            pool_tick(pool_id=pool.pk)
            simulated_work_step()

    assert in_threads(*[ticker] * 4) == []
    assert check_invariants() == []
    drive(pool)
    assert set(HostTask.objects.values_list("state", flat=True)) <= {TaskState.DONE, TaskState.HANDED_OVER}
    assert Lease.objects.filter(active=True).count() == 0


def test_overlapping_gang_operations_never_deadlock_and_are_taken_whole() -> None:
    instant_simulator()
    pool, hosts = make_fleet(domains=1, hosts_per_domain=6, planned_buffer_hosts=4)
    names = [h.hostname for h in hosts]
    gang_a = operation_submit(kind="reboot", scope="hosts: " + ", ".join(names[0:4]), reason="a", gang=True)
    gang_b = operation_submit(kind="reboot", scope="hosts: " + ", ".join(reversed(names[2:6])), reason="b", gang=True)
    single = operation_submit(kind="reboot", scope=f"hosts: {names[3]}", reason="c", priority=900)

    def whole() -> None:
        for gang in (gang_a, gang_b):
            states = list(HostTask.objects.filter(operation=gang).values_list("state", flat=True))
            assert states.count(TaskState.PENDING) in (0, len(states)), states

    drive(pool, each_round=whole)
    for operation in (gang_a, gang_b, single):
        assert not HostTask.objects.filter(operation=operation, state__in=ACTIVE).exists()


def operator_on_duty() -> None:
    for host_id in Host.objects.filter(state=HostState.ESCALATED).values_list("id", flat=True):
        host_escalation_release(host_id=host_id, reason="fixed by hand", actor="operator")


def test_random_overlapping_work_from_many_threads_keeps_every_invariant() -> None:
    instant_simulator(execute_failure_rate=0.05, verify_failure_rate=0.02, refusing_host_fraction=0.05)
    pools = [
        make_fleet(domains=3, hosts_per_domain=4, planned_buffer_hosts=4, failure_buffer_hosts=3)[0] for _ in range(2)
    ]
    hostnames = {pool.pk: list(pool.hosts.values_list("hostname", flat=True)) for pool in pools}
    stop = threading.Event()
    violations: list = []
    submitted = []

    def submitter(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            pool = rng.choice(pools)
            chosen = rng.sample(hostnames[pool.pk], rng.randint(1, 4))
            operation = operation_submit(
                kind=rng.choice(["reboot", "verification"]),
                scope="hosts: " + ", ".join(chosen),
                reason="stress",
                priority=rng.randint(0, 1000),
                gang=rng.random() < 0.2,
            )
            submitted.append(operation.pk)
            if rng.random() < 0.1:
                operation_cancel(operation_id=operation.pk, reason="changed my mind")
            time.sleep(0.02)

    def ticker(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            pool_tick(pool_id=rng.choice(pools).pk)
            simulated_work_step()

    def monitor() -> None:
        while not stop.is_set():
            violations.extend(check_invariants())
            time.sleep(0.05)

    def stopper() -> None:
        time.sleep(8)
        stop.set()

    errors = in_threads(
        lambda: submitter(1), lambda: submitter(2), lambda: ticker(3), lambda: ticker(4), monitor, stopper
    )
    assert errors == []
    assert violations == []
    # A host whose drainer refuses it escalates after three failed repairs and waits for a human, and
    # so does every gang that includes it (a design call): the drainer is mended and the operator on
    # duty releases such hosts, so all the work can finish.
    instant_simulator(execute_failure_rate=0.05, verify_failure_rate=0.02)
    drive(*pools, max_rounds=400, each_round=operator_on_duty)
    assert check_invariants() == []
    assert len(submitted) > 20
    assert not HostTask.objects.filter(state__in=ACTIVE).exists()

"""Fault injection (issue 8): real workers, Redis and PostgreSQL, broken on purpose mid-run.

Each test asserts that nothing was lost (every host ends in service, at its target), nothing doubled
(each work item claimed and reported once per attempt, each version applied once, each task and host
transition recorded once) and nothing stuck (the invariants hold at every poll, no host stays out).
Each fault survived appends its figures to var/reliability/faults.jsonl.

Covered elsewhere, in-process with a virtual clock: an item taken back then failed by policy
(test_work_items), a drain past its deadline and a refused drain (test_work_items,
test_orchestration_flow), a host escalated after three failed repairs (test_orchestration_flow),
racing pool ticks (test_concurrency). Here the same faults meet real worker processes.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import transaction

from config.celery import app as celery_app
from fleet.models import Host, HostState, InstalledVersion, Pool
from opsplanner import tasks
from opsplanner.models import Event, HostTask, Lease, TaskState, WorkItem, WorkKind, WorkState
from opsplanner.services.operations import operation_submit
from opsplanner.services.simulator import chance
from opsplanner.services.work_items import (
    WorkItemConflict,
    work_item_heartbeat,
    work_item_report,
    work_items_claim,
)
from tests.builders import make_fleet
from tests.driving import busy, in_threads, instant_simulator
from tests.faults_helpers import (
    RedisServer,
    Watch,
    assert_applied_once,
    assert_each_transition_once,
    caught_mid_transaction,
    events_locked,
    kill_pool_process,
    kill_worker,
    record_fault,
    redelivered,
    sessions,
    stop_all,
    terminate_backends,
    wait_until_ready,
    worker_env,
)
from tests.processes import WorkerProcess, start_beat, start_worker, wait_for
from tests.trains_builders import make_train
from trains.models import Cycle, Train, Visit
from trains.services.upgrades import upgrade_create
from trains.tasks import trains_tick

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]

TARGETS = {"gpu-driver": "560.35.03", "bios": "2.16.0"}
OLD_DRIVER = "550.127.05"
MID_VISIT = [TaskState.DRAINING, TaskState.RUNNING]
FINISHED = {TaskState.DONE, TaskState.HANDED_OVER}


def slow_hardware() -> None:
    """Simulated hardware slow enough that a visit lasts several seconds: there is a middle to break."""
    instant_simulator(drain_seconds=0.8, execute_seconds=1.0, verify_seconds=0.4, undrain_seconds=0.4)


def train_with_upgrades(pool: Pool, targets: dict[str, str] = TARGETS) -> Train:
    # No auto-resume: a train that stops itself while workers race (its capacity check once read
    # the pool and its own tasks in two statements, and a commit in between looked like "other work")
    # would stall the test, and assert_no_autostop fails it with the reason.
    with transaction.atomic():  # running workers see the train with all its upgrades, or nothing
        train = make_train(pool)
        for component, version in targets.items():
            upgrade_create(pool=pool, component=component, version=version, reason="fault drill")
    return train


def autostops(train: Train) -> int:
    """No pool here has other work or broken hosts: any autostop is a bug (the figures record 0)."""
    reasons = list(Event.objects.filter(kind="train.autostopped", subject_id=train.pk).values_list("reason", flat=True))
    assert reasons == [], reasons
    return len(reasons)


def mid_visit(pool: Pool) -> bool:
    return HostTask.objects.filter(pool_id=pool.pk, state__in=MID_VISIT).exists()


def first_cycle_done(train: Train, pool: Pool) -> bool:
    return Cycle.objects.filter(train=train, number=1, ended_at__isnull=False).exists() and not busy([pool])


def assert_every_host_back_at(pool: Pool, targets: dict[str, str]) -> None:
    """Nothing lost, nothing stuck: every host in service, at every target, no lease left, every task done."""
    assert set(Host.objects.filter(pool=pool).values_list("state", flat=True)) == {HostState.IN_SERVICE}
    for component, version in targets.items():
        installed = InstalledVersion.objects.filter(host__pool=pool, component__name=component)
        assert set(installed.values_list("version__version", flat=True)) == {version}, component
    assert not Lease.objects.filter(pool_id=pool.pk, active=True).exists()
    assert set(HostTask.objects.filter(pool_id=pool.pk).values_list("state", flat=True)) <= FINISHED


def assert_work_ran_once(pool: Pool, hosts: list[Host], tasks_per_host: int) -> None:
    """The executors' log: one drain and one return per host, one execution per task, each item
    claimed once and reported once. A crashed claim that was not rolled back, or a step run twice,
    would show a second attempt or a second report."""
    items = WorkItem.objects.filter(pool_id=pool.pk)
    assert set(items.values_list("state", flat=True)) == {WorkState.DONE}
    per_host = Counter(items.values_list("host_id", "kind"))
    for host in hosts:
        assert per_host[(host.pk, WorkKind.DRAIN)] == 1
        assert per_host[(host.pk, WorkKind.UNDRAIN)] == 1
        assert per_host[(host.pk, WorkKind.EXECUTE)] == tasks_per_host
    assert set(items.values_list("attempts", flat=True)) == {1}
    ids = set(items.values_list("id", flat=True))
    claimed = Counter(Event.objects.filter(kind="work_item.claimed", subject_id__in=ids).values_list("subject_id"))
    reported = Counter(Event.objects.filter(kind="work_item.done", subject_id__in=ids).values_list("subject_id"))
    assert set(claimed.values()) == set(reported.values()) == {1}
    assert len(claimed) == len(reported) == len(ids)


def assert_one_lease_per_admitted_task() -> None:
    """No double admission: a task admitted twice would hold two leases (one after the other)."""
    per_task = Counter(Lease.objects.values_list("host_task_id", flat=True))
    assert per_task, "nothing was admitted"
    assert set(per_task.values()) == {1}


# --- 1. kill -9 a worker mid-visit ------------------------------------------------------------------
@pytest.mark.workers
def test_a_worker_killed_mid_visit_hands_its_work_to_another_and_nothing_is_lost_doubled_or_stuck(
    tmp_path: Path,
) -> None:
    slow_hardware()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=3)
    train = train_with_upgrades(pool)
    first = start_worker(tmp_path, extra_env=worker_env("fault-worker-1"))
    second = start_worker(tmp_path, queue=first.queue, extra_env=worker_env("fault-worker-2"))
    beat = start_beat(tmp_path, queue=first.queue, extra_env=worker_env("fault-beat"))
    by_name = {"fault-worker-1": first, "fault-worker-2": second}
    watch = Watch([first, second, beat])
    try:
        wait_until_ready(first, second)
        watch.until(lambda: mid_visit(pool), timeout=60, what="the first visit to drain its hosts")
        # Each kill lands inside a transaction that changed rows and has not committed. The worker
        # caught first dies whole, as when its machine dies: its unacknowledged message stays with
        # Redis until the visibility timeout, so only the beat's next tick can carry the work on.
        with events_locked():
            (_, name, _), *_ = caught_mid_transaction("fault-worker-")
            doomed = by_name.pop(name)
            watch.processes.remove(doomed)
            kill_worker(doomed)
        # PostgreSQL rolls back a dead session's transaction as soon as it finds the client gone.
        wait_for(lambda: not sessions(name), timeout=30, what="the dead worker's sessions to end")
        # The other loses only the pool process running its task: the worker's main process sees it
        # die and (late ack, reject_on_worker_lost) puts the message back, so the task runs again.
        ((survivor_name, survivor),) = by_name.items()
        with events_locked():
            caught_mid_transaction(survivor_name)
            kill_pool_process(survivor)
        watch.until(lambda: first_cycle_done(train, pool), timeout=120, what="the train's first cycle")
    finally:
        stop_all([first, second, beat])

    assert doomed.process.returncode == -9
    assert "WorkerLostError" in survivor.output()
    assert redelivered(survivor.output()), "the task whose process was killed was not delivered again"
    assert_every_host_back_at(pool, TARGETS)
    assert_work_ran_once(pool, hosts, tasks_per_host=len(TARGETS))
    assert_applied_once({host.pk: TARGETS for host in hosts})
    transitions = assert_each_transition_once()
    record_fault(
        "worker_killed_mid_visit",
        invariant_checks=watch.checks,
        transitions=transitions,
        autostops=autostops(train),
    )


# --- 2. Redis killed and restarted ----------------------------------------------------------------
@pytest.mark.workers
def test_redis_killed_mid_train_and_restarted_loses_its_messages_yet_the_beat_carries_the_train_to_the_end(
    tmp_path: Path,
) -> None:
    slow_hardware()
    pool, hosts = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=3)
    train = train_with_upgrades(pool)
    redis = RedisServer(tmp_path)  # our own: the shared one on 6379 is not ours to restart
    redis.start()
    first = start_worker(tmp_path, extra_env=worker_env("fault-redis-1", REDIS_URL=redis.url))
    second = start_worker(tmp_path, queue=first.queue, extra_env=worker_env("fault-redis-2", REDIS_URL=redis.url))
    beat = start_beat(tmp_path, queue=first.queue, extra_env=worker_env("fault-redis-beat", REDIS_URL=redis.url))
    watch = Watch([first, second, beat])
    try:
        wait_until_ready(first, second)
        watch.until(lambda: mid_visit(pool), timeout=60, what="the first visit to drain its hosts")
        redis.kill()  # no persistence: queued and unacknowledged messages are gone for good
        # While the broker is away nothing moves, and nothing breaks: the state is in PostgreSQL.
        watch.for_seconds(3)
        assert not first_cycle_done(train, pool)  # the outage did land mid-train
        redis.start()
        watch.until(lambda: first_cycle_done(train, pool), timeout=120, what="the train's first cycle")
    finally:
        stop_all([first, second, beat])
        redis.kill()

    for worker in (first, second):
        assert "Connection to broker lost" in worker.output()
    assert_every_host_back_at(pool, TARGETS)
    assert_work_ran_once(pool, hosts, tasks_per_host=len(TARGETS))
    assert_applied_once({host.pk: TARGETS for host in hosts})
    transitions = assert_each_transition_once()
    record_fault(
        "redis_restarted_mid_train",
        invariant_checks=watch.checks,
        transitions=transitions,
        autostops=autostops(train),
    )


# --- 3-5. with two long-lived workers and a beat ------------------------------------------------------
@pytest.fixture(scope="class")
def shared_workers(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[list[WorkerProcess]]:
    """Two workers and the beat for the faults that leave the processes running (class-scoped, so
    that they are gone before the tests above start processes of their own)."""
    tmp_path = tmp_path_factory.mktemp("fault-workers")
    with django_db_blocker.unblock():
        first = start_worker(tmp_path, extra_env=worker_env("fault-shared-1"))
        second = start_worker(tmp_path, queue=first.queue, extra_env=worker_env("fault-shared-2"))
        beat = start_beat(tmp_path, queue=first.queue, extra_env=worker_env("fault-shared-beat"))
        processes = [first, second, beat]
        try:
            wait_until_ready(first, second)
            yield processes
        finally:
            stop_all(processes)


@pytest.fixture
def running_workers(shared_workers: list[WorkerProcess]) -> Iterator[list[WorkerProcess]]:
    """The shared processes, taking tasks only while a test runs. Before pytest-django empties the
    tables they stop consuming and finish what they hold: a worker transaction still open during
    the TRUNCATE can deadlock with it, and the next test would start on a dirty database."""
    first, second, _beat = shared_workers
    names = [first.name, second.name]
    celery_app.control.add_consumer(first.queue, destination=names, reply=True, timeout=5)
    yield shared_workers
    celery_app.control.cancel_consumer(first.queue, destination=names, reply=True, timeout=5)
    wait_for(lambda: workers_idle(names), timeout=30, what="the workers to finish the tasks they hold")


def workers_idle(names: list[str]) -> bool:
    inspect = celery_app.control.inspect(destination=names, timeout=1)
    active, reserved = inspect.active() or {}, inspect.reserved() or {}
    return set(active) == set(reserved) == set(names) and not any([*active.values(), *reserved.values()])


@pytest.mark.workers
class TestWithSharedWorkers:
    def test_workers_whose_database_connections_are_cut_mid_transaction_reconnect_and_finish_the_train(
        self, running_workers: list[WorkerProcess]
    ) -> None:
        slow_hardware()
        pool, hosts = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=3)
        train = train_with_upgrades(pool)
        watch = Watch(list(running_workers))
        watch.until(lambda: mid_visit(pool), timeout=60, what="the first visit to drain its hosts")
        cut = 0
        for _ in range(3):
            with events_locked() as locker:
                caught_mid_transaction("fault-shared-")  # so that at least one cut lands mid-transaction
                cut += terminate_backends(sparing=[locker])
            watch.for_seconds(1)
        cut += terminate_backends()  # idle ones too: a worker finds its connection dead at the next task
        watch.until(lambda: first_cycle_done(train, pool), timeout=120, what="the train's first cycle")

        logs = "".join(worker.output() for worker in running_workers[:2])
        assert "terminating connection due to administrator command" in logs
        assert_every_host_back_at(pool, TARGETS)
        assert_work_ran_once(pool, hosts, tasks_per_host=len(TARGETS))
        assert_applied_once({host.pk: TARGETS for host in hosts})
        transitions = assert_each_transition_once()
        record_fault(
            "postgres_connections_terminated",
            invariant_checks=watch.checks,
            transitions=transitions,
            cut=cut,
            autostops=autostops(train),
        )

    def test_steps_delivered_twice_and_schedulers_racing_admit_and_move_each_host_task_exactly_once(
        self, running_workers: list[WorkerProcess], tmp_path: Path
    ) -> None:
        instant_simulator(drain_seconds=0.2, execute_seconds=0.3, verify_seconds=0.1, undrain_seconds=0.1)
        pool, hosts = make_fleet(domains=2, hosts_per_domain=3, planned_buffer_hosts=3)
        train = train_with_upgrades(pool)
        adhoc, adhoc_hosts = make_fleet(domains=1, hosts_per_domain=4, planned_buffer_hosts=2)
        with transaction.atomic():  # both at once, so that every host is drained once for the two
            operation_submit(
                kind="upgrade",
                component="gpu-driver",
                version=TARGETS["gpu-driver"],
                scope=f"pool {adhoc.name}",
                reason="fault drill",
            )
            operation_submit(kind="reboot", scope=f"pool {adhoc.name}", reason="fault drill")
        queue = running_workers[0].queue
        second_beat = start_beat(tmp_path, queue=queue, extra_env=worker_env("fault-second-beat"))
        watch = Watch([*running_workers, second_beat])
        stop = threading.Event()
        sent: list[str] = []

        def done() -> bool:
            return first_cycle_done(train, pool) and not busy([adhoc])

        def this_process_ticks_too() -> None:
            # A third scheduler: the task functions themselves, run here, racing the workers.
            while not stop.is_set():
                tasks.tick()
                trains_tick()
                tasks.simulated_work_step()

        def each_step_called_twice_with_the_same_ids() -> None:
            while not stop.is_set():
                for pool_id in (pool.pk, adhoc.pk, pool.pk, adhoc.pk):
                    tasks.pool_tick(pool_id)

        def each_message_sent_twice() -> None:
            # The same message (same task id) twice, as a broker redelivering it would.
            while not stop.is_set():
                for task, args in [(tasks.pool_tick, [pool.pk]), (tasks.pool_tick, [adhoc.pk]), (trains_tick, [])]:
                    task_id = str(uuid.uuid4())
                    sent.append(task_id)
                    for _ in range(2):  # expiring, so that a backlog left behind is dropped, not run
                        task.apply_async(args=args, task_id=task_id, queue=queue, expires=10)
                time.sleep(0.3)

        def watcher() -> None:
            try:
                watch.until(done, timeout=120, what="both pools to finish")
            finally:
                stop.set()

        try:
            errors = in_threads(
                this_process_ticks_too,
                this_process_ticks_too,
                each_step_called_twice_with_the_same_ids,
                each_message_sent_twice,
                watcher,
            )
        finally:
            stop.set()
            stop_all([second_beat])
        assert errors == []
        logs = "".join(worker.output() for worker in running_workers[:2])
        assert redelivered(logs) & set(sent), "no message was delivered twice"

        assert_every_host_back_at(pool, TARGETS)
        assert_every_host_back_at(adhoc, {"gpu-driver": TARGETS["gpu-driver"]})
        assert_one_lease_per_admitted_task()
        assert_applied_once({h.pk: TARGETS for h in hosts} | {h.pk: ["gpu-driver"] for h in adhoc_hosts})
        drains = Counter(WorkItem.objects.filter(kind=WorkKind.DRAIN).values_list("host_id", flat=True))
        assert drains == {h.pk: 1 for h in [*hosts, *adhoc_hosts]}
        visits = Visit.objects.filter(train=train, cycle__number=1)
        started = Counter(Event.objects.filter(kind="train.visit_started").values_list("subject_id", flat=True))
        assert visits.count() == 2
        assert all(started[visit.pk] == 1 for visit in visits)
        transitions = assert_each_transition_once()
        record_fault(
            "duplicate_delivery_and_racing_schedulers",
            invariant_checks=watch.checks,
            transitions=transitions,
            autostops=autostops(train),
        )

    def test_an_executor_that_claims_and_vanishes_loses_its_items_to_the_tick_which_retries_then_fails_them(
        self, running_workers: list[WorkerProcess]
    ) -> None:
        instant_simulator()  # the simulated drainer and the repair flow are instant; the executor is us
        pool, _ = make_fleet(domains=1, hosts_per_domain=2, planned_buffer_hosts=2)
        operation = operation_submit(
            kind="upgrade",
            component="gpu-driver",
            version=TARGETS["gpu-driver"],
            scope=f"pool {pool.name}",
            reason="fault drill",
            executor="external",
            max_attempts=2,  # the policy: an item is given back until its last attempt, then failed
        )
        watch = Watch(list(running_workers))
        ready = WorkItem.objects.filter(pool_id=pool.pk, kind=WorkKind.EXECUTE, state=WorkState.READY)
        watch.until(lambda: ready.count() == 2, timeout=30, what="two executions ready to claim")

        ghost = work_items_claim(worker="ghost-1", kinds=["execute"], pool_id=pool.pk, limit=2, lease_seconds=1)
        assert len(ghost) == 2  # and it never heartbeats nor reports
        watch.until(lambda: ready.count() == 2, timeout=30, what="the tick to take the abandoned items back")
        retaken = Event.objects.filter(kind="work_item.retaken", subject_id__in=[item.pk for item in ghost])
        assert retaken.count() == 2
        assert {event.reason for event in retaken} == {
            "ghost-1 stopped heartbeating; attempt 1 given back to the queue"
        }
        # Too late: its report, were it accepted, would apply the upgrade a second time.
        with pytest.raises(WorkItemConflict, match="not running for ghost-1"):
            work_item_report(
                item_id=ghost[0].pk,
                worker="ghost-1",
                key="late",
                outcome="done",
                result={"versions": {"gpu-driver": TARGETS["gpu-driver"]}},
                attempt=1,
            )

        (retried,) = work_items_claim(worker="fw-updater", kinds=["execute"], pool_id=pool.pk, limit=1)
        (abandoned,) = work_items_claim(worker="ghost-2", kinds=["execute"], pool_id=pool.pk, limit=1, lease_seconds=1)
        assert (retried.attempts, abandoned.attempts) == (2, 2)
        work_item_heartbeat(item_id=retried.pk, worker="fw-updater", attempt=2)
        work_item_report(
            item_id=retried.pk,
            worker="fw-updater",
            key=f"fw-{retried.pk}-2",
            outcome="done",
            result={"versions": {"gpu-driver": TARGETS["gpu-driver"]}},
            attempt=2,
        )

        def verify_and_settle() -> bool:
            # The external executor also runs the checks of the task it upgraded (the repair flow's
            # checks are simulated).
            for item in work_items_claim(worker="fw-updater", kinds=["verify"], pool_id=pool.pk, limit=10):
                work_item_report(
                    item_id=item.pk, worker="fw-updater", key=f"fw-{item.pk}", outcome="done", result={"passed": True}
                )
            return not busy([pool])

        watch.until(verify_and_settle, timeout=60, what="the pool to settle")

        abandoned.refresh_from_db()
        assert (abandoned.state, abandoned.attempts) == (WorkState.FAILED, 2)
        assert abandoned.outcome_reason == "ghost-2 stopped heartbeating on the last attempt (2)"
        failed = operation.tasks.get(host_id=abandoned.host_id)
        assert failed.state == TaskState.FAILED
        assert failed.failure_reason == "upgrade failed: ghost-2 stopped heartbeating on the last attempt (2)"
        repair = HostTask.objects.get(host_id=abandoned.host_id, operation__kind="repair")
        assert repair.state == TaskState.DONE
        assert operation.tasks.get(host_id=retried.host_id).state == TaskState.DONE
        # Both hosts are back in service: one upgraded once, the other repaired at its old version.
        assert set(Host.objects.filter(pool=pool).values_list("state", flat=True)) == {HostState.IN_SERVICE}
        driver = dict(
            InstalledVersion.objects.filter(host__pool=pool, component__name="gpu-driver").values_list(
                "host_id", "version__version"
            )
        )
        assert driver == {retried.host_id: TARGETS["gpu-driver"], abandoned.host_id: OLD_DRIVER}
        assert_applied_once({retried.host_id: ["gpu-driver"]})
        claims = Counter(Event.objects.filter(kind="work_item.claimed").values_list("subject_id", flat=True))
        assert claims[retried.pk] == claims[abandoned.pk] == 2
        assert not Lease.objects.filter(active=True).exists()
        transitions = assert_each_transition_once()
        record_fault("executor_vanished_after_claim", invariant_checks=watch.checks, transitions=transitions)

    def test_a_drain_that_hangs_past_its_deadline_fails_its_task_with_the_reason_and_the_host_returns(
        self, running_workers: list[WorkerProcess]
    ) -> None:
        pool, hosts = make_fleet(domains=1, hosts_per_domain=4, planned_buffer_hosts=4)
        # The simulated drainer hangs (for two hours) on some hosts and drains the others at once; the
        # seed is chosen so that both kinds are in the pool.
        seed = next(s for s in range(1, 1000) if 0 < sum(chance(s, "slow", h.pk) < 0.5 for h in hosts) < len(hosts))
        hanging = {h.pk for h in hosts if chance(seed, "slow", h.pk) < 0.5}
        instant_simulator(seed=seed, drain_seconds=0.5, slow_host_fraction=0.5, slow_drain_factor=14400.0)
        operation = operation_submit(kind="reboot", scope=f"pool {pool.name}", reason="fault drill", drain_timeout_s=3)
        watch = Watch(list(running_workers))
        watch.until(lambda: not busy([pool]), timeout=60, what="the pool to settle")

        for task in operation.tasks.all():
            if task.host_id in hanging:
                assert task.state == TaskState.FAILED
                assert task.failure_reason == "drain failed: drain did not finish within its deadline of 3 s"
            else:
                assert task.state == TaskState.DONE
        # Never stuck: the hosts whose drain hung were given back to service, not left draining.
        assert set(Host.objects.filter(pool=pool).values_list("state", flat=True)) == {HostState.IN_SERVICE}
        drains = WorkItem.objects.filter(kind=WorkKind.DRAIN, host_id__in=hanging)
        assert set(drains.values_list("state", flat=True)) == {WorkState.FAILED}
        undrains = WorkItem.objects.filter(kind=WorkKind.UNDRAIN)
        assert Counter(undrains.values_list("host_id", flat=True)) == {h.pk: 1 for h in hosts}
        assert not Lease.objects.filter(active=True).exists()
        transitions = assert_each_transition_once()
        record_fault(
            "drain_hung_past_deadline", invariant_checks=watch.checks, transitions=transitions, hung=len(hanging)
        )

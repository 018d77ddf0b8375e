"""Invariant stress (issue 8): several processes submit, admit and complete thousands of random
overlapping operations for minutes while this process checks the invariants all along.

Each actor (tests/stress_actor.py) submits reboots, verifications and upgrades over random host
subsets (some gang, some across pools, some cancelled, some refused as incompatible), reports hosts
broken in service, ticks random pools and runs the simulated drainer and executor, which fail a few
drains, executions and checks. Then submitting stops, the work drains, and the whole history is
audited: every transition has its event, no host was ever held twice, nothing is left out of service.

STRESS_SECONDS sets how long the actors run (60 by default; `python -m bench reliability` uses 300).
The figures go to var/reliability/stress.jsonl once every assertion passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import F, Q, QuerySet

from fleet.models import Host, HostState, Pool
from fleet.models.hosts import HOST_TRANSITIONS
from fleet.selectors.compatibility import host_incompatibilities
from opsplanner.management.commands.check_invariants import CHECKED_TABLES
from opsplanner.models import (
    ACTIVE_TASK_STATES,
    OPEN_TASK_STATES,
    TERMINAL_TASK_STATES,
    Event,
    HostTask,
    Lease,
    Operation,
    OperationState,
    TaskState,
    WorkItem,
    WorkState,
)
from opsplanner.models.operations import FailureCode
from opsplanner.selectors.invariants import check_invariants
from opsplanner.services.operation_cancel import operation_cancel
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from opsplanner.services.tick.run import operations_close_finished
from tests import processes
from tests.builders import make_fleet
from tests.driving import instant_simulator
from tests.processes import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROCESSES = 3
SECONDS = float(os.environ.get("STRESS_SECONDS", "60"))
DRAIN_SECONDS = 240  # bounded: the actors keep the backlog small, so the drain takes seconds
# The bar for "thousands of operations": on 2 cores shared with other work (load average 6-7) the
# three actors get 1,300-1,400 host tasks through a minute; a machine of its own does better.
HOST_TASKS_PER_MINUTE = 1000
FIGURES = ROOT / "var" / "reliability" / "stress.jsonl"
ANALYZE_EVERY_S = 10.0


def test_several_processes_of_random_overlapping_work_keep_every_invariant_throughout(tmp_path: Path) -> None:
    instant_simulator(execute_failure_rate=0.03, verify_failure_rate=0.01, refusing_host_fraction=0.03)
    pools = [
        make_fleet(domains=4, hosts_per_domain=12, planned_buffer_hosts=24, failure_buffer_hosts=4)[0] for _ in range(3)
    ]
    started = time.monotonic()
    actors = [start_actor(tmp_path, seed) for seed in range(1, PROCESSES + 1)]
    try:
        checks, violations = watch(actors, timeout=SECONDS + 120)
    finally:
        for process, _ in actors:
            if process.poll() is None:
                process.kill()
                process.wait()
    reports = [actor_report(process, log) for process, log in actors]
    assert [report["unexpected"] for report in reports] == [[]] * PROCESSES
    assert violations == [], f"{len(violations)} invariant violations while the actors ran, e.g. {violations[:5]}"
    stressed_seconds = time.monotonic() - started

    analyze_checked_tables()
    checks += drain(pools)
    # The work the operator's cancels set free may escalate another host: they look again until none.
    while cancel_work_waiting_for_escalated_hosts():
        checks += drain(pools)

    assert check_invariants() == []
    assert manage_check_invariants().returncode == 0
    assert_no_host_refused_at_the_pre_return_gate()
    assert_no_task_left_open()
    assert not Lease.objects.filter(active=True).exists()
    assert not in_flight().exists()
    assert not Operation.objects.filter(state=OperationState.OPEN).exists()
    assert_every_host_in_service_or_escalated_with_a_reason()
    assert host_incompatibilities(Host.objects.filter(state=HostState.IN_SERVICE).values_list("pk", flat=True)) == {}
    transitions = assert_every_task_transition_has_one_event()
    assert_every_host_transition_has_its_event()
    assert_no_host_was_ever_held_twice()

    processed = HostTask.objects.filter(state__in=TERMINAL_TASK_STATES).count()
    submitted = sum(report["counts"].get("host_tasks_submitted", 0) for report in reports)
    assert processed >= submitted  # plus the repairs the scheduler submitted itself
    assert processed >= HOST_TASKS_PER_MINUTE * SECONDS / 60, f"only {processed} host tasks in {SECONDS:.0f}s"
    # Failures are cheap to process: most of the work must have succeeded (done, or done and handed over).
    succeeded = HostTask.objects.filter(state__in=[TaskState.DONE, TaskState.HANDED_OVER]).count()
    assert succeeded >= 0.7 * processed
    record_figures(
        processes=PROCESSES,
        seconds=round(SECONDS),
        operations=Operation.objects.count(),
        host_tasks=processed,
        host_task_states=dict(Counter(HostTask.objects.values_list("state", flat=True))),
        transitions=transitions,
        invariant_checks=checks,
        violations=0,
        escalated=Host.objects.filter(state=HostState.ESCALATED).count(),
        wall_seconds=round(stressed_seconds),
        actors=dict(sum((Counter(report["counts"]) for report in reports), Counter())),
    )


# --- the actors and the watch ---------------------------------------------------------------------
def start_actor(tmp_path: Path, seed: int) -> tuple[subprocess.Popen, Path]:
    env = dict(os.environ, DATABASE_URL=processes.test_database_url(), DEBUG="1", KICK_TASKS="0")
    env["OPSPLANNER_VAR_DIR"] = str(tmp_path / f"var-{seed}")
    log = tmp_path / f"actor-{seed}.log"
    command = [sys.executable, "-m", "tests.stress_actor", "--seed", str(seed), "--seconds", str(SECONDS)]
    with log.open("wb") as sink:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    return process, log


def watch(actors: list[tuple[subprocess.Popen, Path]], *, timeout: float) -> tuple[int, list[str]]:
    """Check the invariants over and over until every actor has exited; returns (checks, violations)."""
    checks, violations = 0, []
    deadline = time.monotonic() + timeout
    analyzed = 0.0
    while any(process.poll() is None for process, _ in actors):
        assert time.monotonic() < deadline, "the stress actors did not stop on time"
        if time.monotonic() - analyzed > ANALYZE_EVERY_S:
            analyze_checked_tables()
            analyzed = time.monotonic()
        violations.extend(f"{time.monotonic():.1f}: {violation}" for violation in check_invariants())
        checks += 1
        time.sleep(0.2)  # the actors need the two cores more than a check every instant
    return checks, violations


def analyze_checked_tables() -> None:
    """What autovacuum would do on a live server (it is off on this machine): without fresh statistics
    of the growing event table, the checks' anti-joins were planned as nested loops, 18 s a check."""
    with connection.cursor() as cursor:
        for table in CHECKED_TABLES:
            cursor.execute(f'ANALYZE "{table}"')


def actor_report(process: subprocess.Popen, log: Path) -> dict:
    output = log.read_text(errors="replace")
    assert process.returncode == 0, f"stress actor exited {process.returncode}:\n{output[-4000:]}"
    return json.loads(output.strip().splitlines()[-1])


def drain(pools: list[Pool]) -> int:
    """Tick and simulate until the pools are quiet: nothing under way, nothing in flight, and the
    last round moved no task (what is still pending is then blocked). A round can end work without
    putting it under way (an upgrade whose host already runs its target finishes at admission), and
    what a moved task freed may go only in the next round: an idle round alone does not mean quiet.
    Returns the invariant checks made, one per round, each clean."""
    checks = 0
    deadline = time.monotonic() + DRAIN_SECONDS
    while True:
        moved_before = last_task_transition()
        for pool in pools:
            pool_tick(pool_id=pool.pk)  # admits whatever can be admitted: it is then under way
        # As the beat's fleet tick does after the pools: an operation over two pools whose last tasks
        # finished in two racing ticks (each saw the other's still open) is closed by this sweep.
        operations_close_finished()
        simulated_work_step()
        assert check_invariants() == []
        checks += 1
        under_way = HostTask.objects.filter(state__in=ACTIVE_TASK_STATES)
        if not under_way.exists() and not in_flight().exists() and last_task_transition() == moved_before:
            return checks
        assert time.monotonic() < deadline, f"not drained after {DRAIN_SECONDS}s: {list(under_way.values()[:5])}"


def last_task_transition() -> int | None:
    """The id of the last task transition's event: it changes whenever a task moves."""
    return Event.objects.filter(kind="task.state_changed").order_by("-id").values_list("id", flat=True).first()


def in_flight() -> QuerySet[WorkItem]:
    """Work items not yet finished, or finished and not yet taken into account by a tick."""
    return WorkItem.objects.filter(
        Q(state__in=[WorkState.WAITING, WorkState.READY, WorkState.RUNNING]) | Q(consumed_at__isnull=True)
    )


def cancel_work_waiting_for_escalated_hosts() -> int:
    """An escalated host waits for a human, and so does whatever queues behind its pending tasks
    (a gang holding it waits, and lower priorities wait for the gang). The operator cancels the
    operations with work pending on escalated hosts; everything else then runs. Returns how many."""
    waiting = HostTask.objects.filter(state=TaskState.PENDING, host__state=HostState.ESCALATED)
    operation_ids = set(waiting.values_list("operation_id", flat=True))
    for operation_id in operation_ids:
        operation_cancel(operation_id=operation_id, reason="its hosts are escalated to a human")
    return len(operation_ids)


def manage_check_invariants() -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DATABASE_URL=processes.test_database_url(), DEBUG="1")
    command = [sys.executable, "manage.py", "check_invariants"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert "no violation" in result.stdout, result.stderr
    return result


def assert_no_host_refused_at_the_pre_return_gate() -> None:
    """Nothing here makes a target incompatible or withdraws a version, so a host the gate refuses was
    given versions by the scheduler that contradict each other (and is repaired for nothing)."""
    refused = list(HostTask.objects.filter(failure_code=FailureCode.NOT_RETURNABLE).values_list("id", "failure_reason"))
    assert refused == [], f"hosts refused at the pre-return gate: {refused[:5]}"


def assert_no_task_left_open() -> None:
    """Every task ended; if not, the message says why each open one waits, and on what host."""
    open_tasks = list(
        HostTask.objects.filter(state__in=OPEN_TASK_STATES)
        .order_by("id")
        .values("id", "operation_id", "operation__gang", "priority", "state", "waiting_code", "waiting_reason")
        .annotate(hostname=F("host__hostname"), host_state=F("host__state"))[:20]
    )
    assert open_tasks == [], "tasks left open:\n" + "\n".join(str(task) for task in open_tasks)


# --- the audit of the whole history ---------------------------------------------------------------
def assert_every_host_in_service_or_escalated_with_a_reason() -> None:
    states = dict(Host.objects.values_list("pk", "state"))
    assert set(states.values()) <= {HostState.IN_SERVICE, HostState.ESCALATED}, states
    for host_id in [pk for pk, state in states.items() if state == HostState.ESCALATED]:
        escalation = Event.objects.filter(kind="host.escalated", subject_id=host_id).order_by("-id").first()
        assert escalation is not None, f"host {host_id} escalated with no event saying so"
        assert escalation.reason, f"host {host_id} escalated without a reason"


def assert_every_task_transition_has_one_event() -> int:
    """Replaying each task's events, in the order written, walks from pending to its final state,
    one step at a time, never taking the same step twice. Returns how many transitions there were."""
    chains: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for task_id, data in (
        Event.objects.filter(subject_type="opsplanner.hosttask", kind="task.state_changed")
        .order_by("id")
        .values_list("subject_id", "data")
    ):
        chains[task_id].append((data["from"], data["to"]))
    for task_id, state in HostTask.objects.values_list("pk", "state"):
        chain = chains.pop(task_id, [])
        steps = [TaskState.PENDING, *(to for _, to in chain)]
        assert [before for before, _ in chain] == steps[:-1], f"task {task_id}: broken chain {chain}"
        assert steps[-1] == state, f"task {task_id} is {state}, its events say {steps[-1]}"
        assert len(set(chain)) == len(chain), f"task {task_id} took a step twice: {chain}"
    assert chains == {}, f"events of tasks that do not exist: {list(chains)[:5]}"
    return sum(1 for _ in Event.objects.filter(kind="task.state_changed").values_list("pk"))


def assert_every_host_transition_has_its_event() -> None:
    """Each host's events, in order, are allowed transitions from in service to its state now."""
    chains: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for host_id, data in (
        Event.objects.filter(subject_type="fleet.host", kind="host.state_changed")
        .order_by("id")
        .values_list("subject_id", "data")
    ):
        chains[host_id].append((data["from"], data["to"]))
    for host_id, state in Host.objects.values_list("pk", "state"):
        current = HostState.IN_SERVICE
        for before, after in chains.get(host_id, []):
            assert before == current, f"host {host_id}: event {before}->{after} while it was {current}"
            assert after in HOST_TRANSITIONS[before], f"host {host_id}: {before}->{after} is not allowed"
            current = after
        assert current == state, f"host {host_id} is {state}, its events say {current}"


def assert_no_host_was_ever_held_twice() -> None:
    """Lease history: each host's next lease starts no earlier than its previous one ended."""
    previous: dict[int, Lease] = {}
    for lease in Lease.objects.order_by("host_id", "acquired_at", "id"):
        before = previous.get(lease.host_id)
        if before is not None:
            assert before.released_at is not None, f"host {lease.host_id}: lease {before.pk} never released"
            assert before.released_at <= lease.acquired_at, (
                f"host {lease.host_id}: lease {lease.pk} from {lease.acquired_at} overlaps lease {before.pk} "
                f"until {before.released_at}"
            )
        previous[lease.host_id] = lease


def record_figures(**figures: object) -> None:
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    with FIGURES.open("a") as out:
        out.write(json.dumps(figures, sort_keys=True) + "\n")

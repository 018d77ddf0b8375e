"""Fault injection for tests/test_faults.py: kill -9 worker processes, stop and restart a private Redis,
catch a worker inside a transaction with a table lock, cut PostgreSQL connections; and the proofs that
nothing was lost, doubled or left stuck."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from django.db import connection

from opsplanner.models import Event, HostTask, Operation, WorkerHeartbeat, WorkItem
from opsplanner.selectors.invariants import check_invariants
from opsplanner.services.tick.context import ACTOR as SCHEDULER
from tests.processes import ROOT, WorkerProcess, free_port, test_database_url, wait_for

FIGURES = ROOT / "var" / "reliability" / "faults.jsonl"


# --- processes ------------------------------------------------------------------------------------
def worker_env(application_name: str, **extra: str) -> dict[str, str]:
    """Worker settings that name its PostgreSQL sessions, so the test can find them in pg_stat_activity."""
    return {"TICK_SECONDS": "1", "DATABASE_URL": f"{test_database_url()}?application_name={application_name}", **extra}


def wait_until_ready(*workers: WorkerProcess) -> None:
    names = [worker.name for worker in workers]

    def ready() -> bool:
        for worker in workers:
            assert worker.process.poll() is None, f"{worker.name} exited:\n{worker.output()[-3000:]}"
        return WorkerHeartbeat.objects.filter(worker__in=names).count() == len(names)

    wait_for(ready, timeout=60, what=f"{len(names)} workers to report ready", interval=0.3)


def stop_all(processes: Iterable[WorkerProcess]) -> None:
    """Ask every process to stop at once, then wait for each (a warm shutdown takes a few seconds)."""
    processes = list(processes)
    for process in processes:
        if process.process.poll() is None:
            process.process.terminate()
    for process in processes:
        process.stop()


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # The command name, in parentheses, may hold spaces: the parent pid is the second field after it.
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    return children


def descendants(pid: int) -> list[int]:
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_worker(worker: WorkerProcess) -> list[int]:
    """kill -9 the whole worker, as when its machine dies: the main process first (so that it cannot
    fork a replacement), then its pool processes. The worker was started in the test's process group,
    so the group is not ours to kill: each pid is."""
    pids = [worker.process.pid, *descendants(worker.process.pid)]
    for pid in pids:
        with suppress(ProcessLookupError):  # gone already
            os.kill(pid, signal.SIGKILL)
    worker.process.wait(timeout=10)
    return pids


def kill_pool_process(worker: WorkerProcess) -> int:
    """kill -9 only the prefork pool process (concurrency 1: the one running the task); the worker's
    main process sees it lost and, with late acks and reject_on_worker_lost, requeues the message."""
    (child,) = descendants(worker.process.pid)
    os.kill(child, signal.SIGKILL)
    return child


# --- PostgreSQL ---------------------------------------------------------------------------------
@contextmanager
def events_locked() -> Iterator[int]:
    """Hold the event table in EXCLUSIVE mode on a connection of our own: readers go on, but every
    worker transaction that writes an event stops there, half done, until the lock is released.
    Yields the locking session's backend pid."""
    with psycopg.connect(test_database_url(), application_name="fault-locker") as locker:
        locker.execute(f'LOCK TABLE "{Event._meta.db_table}" IN EXCLUSIVE MODE')
        pid = locker.info.backend_pid
        try:
            yield pid
        finally:
            locker.rollback()


def sessions(application_name: str, *, waiting_on_lock: bool = False) -> list[tuple[int, str, str]]:
    """(pid, application name, query) of this database's sessions whose application name starts with
    `application_name`."""
    sql = (
        "SELECT pid, application_name, query FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name LIKE %s AND pid <> pg_backend_pid()"
    )
    if waiting_on_lock:
        sql += " AND wait_event_type = 'Lock'"
    with connection.cursor() as cursor:
        cursor.execute(sql, [application_name + "%"])
        return list(cursor.fetchall())


def caught_mid_transaction(application_name: str, *, timeout: float = 30) -> list[tuple[int, str, str]]:
    """Wait until a session of these workers is stopped on the event lock: inside a transaction that
    has changed rows and not committed."""
    return wait_for(  # type: ignore[return-value]
        lambda: sessions(application_name, waiting_on_lock=True),
        timeout=timeout,
        what=f"a {application_name} transaction to reach the event lock",
        interval=0.05,
    )


def terminate_backends(*, sparing: Iterable[int] = ()) -> int:
    """Cut every other connection to the test database (the workers'), as a failover or a network
    blip would; returns how many were cut. The server keeps running: other databases share it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_type = 'client backend' "
            "AND pid <> pg_backend_pid() AND NOT (pid = ANY(%s))",
            [list(sparing)],
        )
        return cursor.fetchone()[0]


# --- Redis --------------------------------------------------------------------------------------
@dataclass
class RedisServer:
    """A private redis-server on a free port, so that killing it touches nobody else's."""

    tmp_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.starts += 1
        log = self.tmp_path / f"redis-{self.port}-{self.starts}.log"
        command = [
            *("redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""),
            *("--appendonly", "no", "--daemonize", "no", "--dir", str(self.tmp_path)),
        ]
        with log.open("wb") as sink:
            self.process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        wait_for(self._answers, timeout=15, what=f"redis-server on port {self.port}", interval=0.1)

    def _answers(self) -> bool:
        assert self.process is not None
        assert self.process.poll() is None, "redis-server exited"
        result = subprocess.run(
            ["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True, timeout=5, check=False
        )
        return result.stdout.strip() == "PONG"

    def kill(self) -> None:
        """kill -9: with no persistence, every queued and unacknowledged message dies with it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


# --- watching and proving -------------------------------------------------------------------------
@dataclass
class Watch:
    """Polls a condition while checking the invariants and that the processes are still alive."""

    processes: list[WorkerProcess] = field(default_factory=list)
    checks: int = 0

    def check(self) -> None:
        violations = check_invariants()
        self.checks += 1
        assert violations == [], f"invariants broke: {[str(v) for v in violations]}"
        for process in self.processes:
            assert process.process.poll() is None, f"{process.name} exited:\n{process.output()[-3000:]}"

    def until(self, done: Callable[[], object], *, timeout: float, what: str, interval: float = 0.3) -> None:
        def condition() -> bool:
            self.check()
            return bool(done())

        try:
            wait_for(condition, timeout=timeout, what=what, interval=interval)
        except AssertionError as error:
            if "timed out" not in str(error):
                raise
            raise AssertionError(f"{error}\n{unfinished()}") from None

    def for_seconds(self, seconds: float, *, interval: float = 0.3) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.check()
            time.sleep(interval)


def unfinished() -> str:
    """What is still open, to say why a wait timed out."""
    from trains.models import Train, Visit

    open_items = WorkItem.objects.filter(state__in=["waiting", "ready", "running"]) | WorkItem.objects.filter(
        consumed_at__isnull=True, state__in=["done", "failed"]
    )
    lines = [
        "open tasks: "
        + repr(
            list(
                HostTask.objects.exclude(state__in=["done", "handed_over", "failed", "cancelled"]).values_list(
                    "id", "pool_id", "operation__kind", "state", "host__state", "waiting_reason"
                )[:20]
            )
        ),
        "open work: "
        + repr(
            list(open_items.values_list("id", "host_id", "kind", "state", "claimed_by", "due_at", "consumed_at")[:20])
        ),
        "trains: " + repr(list(Train.objects.values_list("id", "state", "state_reason"))),
        "visits: " + repr(list(Visit.objects.values_list("id", "cycle__number", "domain__name", "state"))),
        "rolled back ticks: " + repr(list(Event.objects.filter(kind="tick.rolled_back").values_list("reason")[:5])),
    ]
    return "\n".join(lines)


def repeated(counts: Counter) -> dict:
    return {key: n for key, n in counts.items() if n != 1}


def transition_counts(kind: str, subject_type: str) -> Counter:
    """How many times each subject made each transition (from, to), from the events."""
    rows = Event.objects.filter(kind=kind, subject_type=subject_type).values_list("subject_id", "data")
    return Counter((subject_id, data.get("from"), data.get("to")) for subject_id, data in rows)


def assert_each_transition_once() -> int:
    """Every host task made each of its transitions once, and so did every host (each drained once
    here): a doubled delivery or tick would have written a transition twice. Returns the count checked."""
    tasks = transition_counts("task.state_changed", "opsplanner.hosttask")
    hosts = transition_counts("host.state_changed", "fleet.host")
    assert tasks, "no task transitions recorded"
    assert repeated(tasks) == {}, "a host task made a transition twice"
    assert repeated(hosts) == {}, "a host made a transition twice"
    return sum(tasks.values()) + sum(hosts.values())


def assert_applied_once(expected: dict[int, Iterable[str]]) -> None:
    """The scheduler's record of what executors applied: one version installed per host and component
    (the inventory's own events, from building the fleet, are not the scheduler's)."""
    applied = Event.objects.filter(kind="host.version_installed", actor=SCHEDULER).values_list("host_id", "data")
    installed = Counter((host_id, data.get("component")) for host_id, data in applied)
    wanted = {(host_id, component): 1 for host_id, components in expected.items() for component in components}
    assert dict(installed) == wanted, f"installed {dict(installed)}, expected {wanted}"


def redelivered(log: str) -> set[str]:
    """Ids of the Celery tasks a worker received more than once (a redelivery or a duplicate)."""
    received = Counter(re.findall(r"Task [\w.]+\[([0-9a-f-]{36})\] received", log))
    return {task_id for task_id, n in received.items() if n > 1}


def record_fault(fault: str, *, invariant_checks: int, **extra: object) -> None:
    """One JSON line of figures per fault survived; written only once the test's assertions passed."""
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    line = {
        "fault": fault,
        "survived": True,
        "operations": Operation.objects.count(),
        "host_tasks": HostTask.objects.count(),
        "invariant_checks": invariant_checks,
        "violations": 0,
        **extra,
    }
    with _figures_lock, FIGURES.open("a") as sink:
        sink.write(json.dumps(line, sort_keys=True) + "\n")


_figures_lock = threading.Lock()

"""Executors and drainers claim ready work items, heartbeat, and report the outcome.

Claiming is safe with many claimers at once (FOR UPDATE SKIP LOCKED on PostgreSQL; SQLite runs
writers one at a time). A report carries an idempotency key: the same report again returns the
first answer and changes nothing; a different report for a finished item is a conflict. A claim
never hands out an install whose target is withdrawn: it stops it as the withdrawal would.
The batch calls (many items in one request) are in work_item_batches.py.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import F, QuerySet

from fleet.models import Host
from opsplanner import clock
from opsplanner.events import EventRow, event_row, events_copy_rows
from opsplanner.models import Adapter, WorkItem, WorkKind, WorkState
from opsplanner.prepared import IDS, ParamKind, PreparedModels, PreparedQuery, PreparedUpdate
from opsplanner.services.ready_watch import ReadyFilter
from opsplanner.services.ready_watch import watcher as ready_watcher
from opsplanner.services.rollback import withdrawn_installs_stop, withdrawn_target_install

SUBJECT = "opsplanner.workitem"
MAX_CLAIM = 1000
MAX_LEASE_SECONDS = 24 * 3600
MAX_BATCH = 500
MAX_WAIT_SECONDS = 60  # the agent asks 50 s: under the usual 60-s idle timeout of a load balancer
# Long-polling claims waiting at once in one process; past this a claim answers at once. A waiter
# holds a request thread (the ASGI handler runs each sync request on a thread of its own) but no
# database connection while it sleeps: the process's one ready watcher looks for all of them.
MAX_WAITERS = 2000
ACCEPTED, DUPLICATE, REFUSED, EXTENDED = "accepted", "duplicate", "refused", "extended"


class WorkItemConflict(ValidationError):
    """The item is not in a state that allows this (already finished, not yours, not running)."""


log = logging.getLogger(__name__)


def _validate_claim(limit: int, lease_seconds: int, kinds: list[str] | None) -> None:
    if not 1 <= limit <= MAX_CLAIM:
        raise ValidationError({"limit": f"Claim between 1 and {MAX_CLAIM} items at a time."})
    if not 1 <= lease_seconds <= MAX_LEASE_SECONDS:
        raise ValidationError({"lease_seconds": f"The lease must be 1 to {MAX_LEASE_SECONDS} seconds."})
    unknown = [kind for kind in kinds or [] if kind not in WorkKind.values]
    if unknown:
        raise ValidationError({"kinds": f"Unknown kinds: {', '.join(unknown)}; use {', '.join(WorkKind.values)}."})


@transaction.atomic
def work_items_claim(
    *,
    worker: str,
    adapter: str = Adapter.EXTERNAL,
    kinds: list[str] | None = None,
    pool_id: int | None = None,
    limit: int = 10,
    lease_seconds: int = 300,
    only: tuple[str, ...] | None = None,
    host_id: int | None = None,
) -> list[WorkItem]:
    """Claim up to `limit` ready items; each stays ours while we heartbeat before its lease ends.
    `only` loads just those fields of the claimed items (the simulator claims thousands an hour);
    `host_id` claims only that host's items."""
    if not worker:
        raise ValidationError({"worker": "Say who is claiming (a worker name)."})
    _validate_claim(limit, lease_seconds, kinds)
    actor, now = worker[:150], clock.now()
    shape = (adapter, tuple(kinds or ()), pool_id is not None, host_id is not None)
    wanted = {name: value for name, value in (("pool_id", pool_id), ("host_id", host_id)) if value is not None}
    ids: list[int] = []
    while len(ids) < limit:
        rows = _ready_ids(*shape, limit - len(ids)).rows(**wanted)
        taking = [item_id for item_id, withdrawn in rows if not withdrawn]
        if taking:
            _CLAIM.count(ids=taking, worker=actor, now=now, expires=now + dt.timedelta(seconds=lease_seconds))
            ids += taking
        withdrawn = [item_id for item_id, withdrawn in rows if withdrawn]
        if not withdrawn:
            break
        # Not handed out: stopped as the withdrawal stops them; then claim the room they took.
        withdrawn_installs_stop(item_ids=withdrawn, actor=actor)
    if not ids:
        return []
    items = _claimed(only).objects(ids=ids)
    events_copy_rows(
        [
            EventRow(
                now,
                "work_item.claimed",
                None,
                actor,
                SUBJECT,
                item.pk,
                item.pool_id,
                item.host_id,
                "",
                json.dumps({"attempt": item.attempts, "kind": item.kind}),
            )
            for item in items
        ]
    )
    return items


@functools.lru_cache(maxsize=64)
def _ready_ids(adapter: str, kinds: tuple[str, ...], by_pool: bool, by_host: bool, limit: int) -> PreparedQuery:
    """The first `limit` ready items a claim may take, locked, skipping those another claim holds, as
    (id, whether it is an install of a withdrawn target: stopped, not handed out); compiled once per
    shape of claim (claimers poll it all day).

    The guard costs no query: the flag is an EXISTS over the item's task, operation and version (three
    primary-key probes), evaluated only for the never-claimed execute items among the rows, in this
    statement. It reads the version's `withdrawn_at` without locking it (only the items are locked,
    `of=self`): a withdrawal committed before this statement began is seen (READ COMMITTED: each
    statement reads what was committed when it began), so a claim after it never hands the install
    out. A withdrawal that commits later is ordered after this claim, as any claim before it: if it
    reached the row first, the row is locked and skipped here (SKIP LOCKED), and its stop fails it;
    if this claim did, the stop waits for the row (HELD_ROWS_WAIT_MS at most) and finds it running,
    claimed before the withdrawal, which runs on. The claim waits for no lock (it skips held rows,
    takes none on the version), so it adds no wait to the withdrawal's order (the version row, then
    the install rows): no deadlock. A KEY SHARE on the version row would see nothing more and wait
    for the offboarding's full lock."""
    params: dict[str, ParamKind] = {
        name: int for name, wanted in (("pool_id", by_pool), ("host_id", by_host)) if wanted
    }

    def build(*, pool_id: int | None = None, host_id: int | None = None) -> QuerySet[WorkItem, tuple[int, bool]]:
        ready = _ready(adapter=adapter, kinds=list(kinds), pool_id=pool_id, host_id=host_id)
        ready = ready.annotate(withdrawn=withdrawn_target_install()).order_by("id")
        return ready.select_for_update(skip_locked=True, of=("self",)).values_list("id", "withdrawn")[:limit]

    return PreparedQuery(build, **params)


@functools.lru_cache(maxsize=64)
def _claimed(only: tuple[str, ...] | None) -> PreparedModels:
    """The claimed items, whole or with just the fields `only` names: compiled once per shape."""

    def build(*, ids: frozenset[int]) -> QuerySet[WorkItem]:
        claimed = WorkItem.objects.filter(pk__any=ids).order_by("id")
        return claimed if only is None else claimed.only("id", "kind", "attempts", "pool_id", "host_id", *only)

    return PreparedModels(build, ids=IDS)


_CLAIM = PreparedUpdate(
    lambda *, ids, worker, now, expires: WorkItem.objects.filter(pk__any=ids, state=WorkState.READY),
    lambda *, ids, worker, now, expires: {
        "state": WorkState.RUNNING,
        "claimed_by": worker,
        "claimed_at": now,
        "lease_expires_at": expires,
        "attempts": F("attempts") + 1,
    },
    ids=IDS,
    worker=str,
    now=dt.datetime,
    expires=dt.datetime,
)


def _ready(*, adapter: str, kinds: list[str] | None, pool_id: int | None, host_id: int | None) -> QuerySet[WorkItem]:
    ready = WorkItem.objects.filter(state=WorkState.READY, adapter=adapter)
    if kinds:
        ready = ready.filter(kind__in=kinds)
    if pool_id is not None:
        ready = ready.filter(pool_id=pool_id)
    if host_id is not None:
        ready = ready.filter(host_id=host_id)
    return ready


def claim_host_id(hostname: str) -> int:
    """The id of the host a claim names; a clear refusal naming it when there is no such host."""
    host_id = Host.objects.filter(hostname=hostname).values_list("id", flat=True).first()
    if host_id is None:
        raise ValidationError({"host": f"There is no host {hostname!r}."}, code="invalid")
    return host_id


_waiters = threading.BoundedSemaphore(MAX_WAITERS)


def work_items_claim_waiting(
    *,
    worker: str,
    wait_seconds: float,
    adapter: str = Adapter.EXTERNAL,
    kinds: list[str] | None = None,
    pool_id: int | None = None,
    limit: int = 10,
    lease_seconds: int = 300,
    host_id: int | None = None,
    only: tuple[str, ...] | None = None,
) -> list[WorkItem]:
    """A long poll: claim as `work_items_claim`; when nothing is ready, sleep until the process's
    ready watcher sees an item this claim could take, then claim again, until `wait_seconds` (real
    time, at most MAX_WAIT_SECONDS) pass: empty at the bound. Not one transaction: each claim is its
    own, and no transaction or connection is held while sleeping. Past MAX_WAITERS waiters in this
    process, it answers at once."""
    claim = functools.partial(
        work_items_claim,
        worker=worker,
        adapter=adapter,
        kinds=kinds,
        pool_id=pool_id,
        limit=limit,
        lease_seconds=lease_seconds,
        host_id=host_id,
        only=only,
    )
    items = claim()
    if items or wait_seconds <= 0 or not _waiters.acquire(blocking=False):
        return items
    wanted = ReadyFilter(adapter, frozenset(kinds or ()), pool_id, host_id)
    try:
        deadline = time.monotonic() + min(wait_seconds, MAX_WAIT_SECONDS)
        while (left := deadline - time.monotonic()) > 0:
            if not connection.in_atomic_block:
                connection.close()  # back to the pool (or closed) while we sleep
            if not ready_watcher.wait(wanted, left):
                return []
            items = claim()  # another claim may have won the item: then wait on
            if items:
                return items
        return []
    finally:
        _waiters.release()


@transaction.atomic
def work_item_heartbeat(
    *, item_id: int, worker: str, lease_seconds: int = 300, attempt: int | None = None
) -> dt.datetime:
    """Extend the lease of an item we are running; a conflict when it is no longer ours. `attempt`
    (from the claim) tells a stale claim from a new one by a worker of the same name."""
    _validate_claim(1, lease_seconds, None)
    expires = clock.now() + dt.timedelta(seconds=lease_seconds)
    mine = WorkItem.objects.filter(pk=item_id, state=WorkState.RUNNING, claimed_by=worker)
    if attempt is not None:
        mine = mine.filter(attempts=attempt)
    changed = mine.update(lease_expires_at=expires)
    if changed != 1:
        raise WorkItemConflict(_not_running_for(item_id, worker, attempt), code="conflict")
    return expires


def _not_running_for(item_id: int, worker: str, attempt: int | None = None) -> str:
    item = WorkItem.objects.filter(pk=item_id).values_list("state", "claimed_by", "attempts").first()
    return _not_running_message(item_id, item, worker, attempt)


def _not_running_message(
    item_id: int, item: tuple[str, str, int] | None, worker: str, attempt: int | None = None
) -> str:
    if item is None:
        return f"There is no work item #{item_id}."
    state, holder, attempts = item
    if state == WorkState.RUNNING and holder == worker and attempt is not None and attempt != attempts:
        return f"Work item #{item_id} is on attempt {attempts}; the claim of attempt {attempt} expired."
    if state == WorkState.RUNNING:
        return f"Work item #{item_id} is running for {holder}, not for {worker}."
    return f"Work item #{item_id} is {state}, not running for {worker} (its lease may have expired)."


def _has_nul(value: Any) -> bool:
    """Whether a NUL is in any string of a report: PostgreSQL's text and jsonb refuse it (a 500)."""
    stack = [value]
    while stack:  # a loop, not recursion: a deeply nested result must not end in a RecursionError
        item = stack.pop()
        if isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple):
            stack += item
        elif isinstance(item, str) and "\x00" in item:
            return True
    return False


def _validate_result(item: WorkItem, outcome: str, result: dict[str, Any], reason: str = "") -> None:
    if outcome not in (WorkState.DONE, WorkState.FAILED):
        raise ValidationError({"outcome": "The outcome is 'done' or 'failed'."})
    if not isinstance(result, dict):
        raise ValidationError({"result": "The result is an object."})
    if not isinstance(reason, str) or "\x00" in reason:
        raise ValidationError({"reason": "The reason is text without NUL characters."})
    versions = result.get("versions", {})
    if not isinstance(versions, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in versions.items()
    ):
        raise ValidationError({"result": "result.versions maps component names to version strings."})
    # A name the catalogue does not know is reported as unknown by the tick; a NUL cannot be stored.
    if _has_nul(result):
        raise ValidationError({"result": "The result has a NUL character in a text."})
    if item.kind == WorkKind.VERIFY and outcome == WorkState.DONE and not isinstance(result.get("passed"), bool):
        raise ValidationError({"result": "A verification report says result.passed: true or false."})
    if item.kind == WorkKind.EXECUTE and outcome == WorkState.DONE and item.params.get("component"):
        reported = versions.get(item.params["component"])
        if reported is None:
            raise ValidationError(
                {"result": f"An upgrade report gives result.versions[{item.params['component']!r}], the new version."}
            )


def _validate_key(key: str) -> None:
    if not key or len(key) > 128 or "\x00" in key:
        raise ValidationError({"key": "Give an idempotency key of 1 to 128 characters (no NUL)."})


def _check_report(
    item: WorkItem, *, worker: str, outcome: str, result: dict[str, Any], attempt: int | None, reason: str = ""
) -> None:
    """Refuse a report (not a retry) of a locked item as a conflict or an invalid result."""
    item_id = item.pk
    if item.state in (WorkState.DONE, WorkState.FAILED):
        raise WorkItemConflict(
            f"Work item #{item_id} was already reported {item.state} with another key.", code="conflict"
        )
    if item.state != WorkState.RUNNING or item.claimed_by != worker:
        raise WorkItemConflict(
            _not_running_message(item_id, (item.state, item.claimed_by, item.attempts), worker), code="conflict"
        )
    if attempt is not None and attempt != item.attempts:
        raise WorkItemConflict(
            f"Work item #{item_id} is on attempt {item.attempts}; the claim of attempt {attempt} expired.",
            code="conflict",
        )
    _validate_result(item, outcome, result, reason)


@transaction.atomic
def work_item_report(
    *,
    item_id: int,
    worker: str,
    key: str,
    outcome: str,
    result: dict[str, Any] | None = None,
    reason: str = "",
    attempt: int | None = None,
) -> WorkItem:
    """Record the outcome of an item we ran. Repeating the same key returns the first answer.
    `attempt` (from the claim) refuses a report from a claim that expired and was given again."""
    _validate_key(key)
    result = result if result is not None else {}
    item = WorkItem.objects.select_for_update().filter(pk=item_id).first()
    if item is None:
        raise WorkItemConflict(f"There is no work item #{item_id}.", code="not_found")
    if item.report_key == key:
        return item  # a retried report: same answer, no change
    _check_report(item, worker=worker, outcome=outcome, result=result, attempt=attempt, reason=reason)
    now = clock.now()
    changed = WorkItem.objects.filter(pk=item_id, state=WorkState.RUNNING, claimed_by=worker).update(
        state=outcome, result=result, report_key=key, outcome_reason=reason[:500], finished_at=now
    )
    if changed != 1:  # pragma: no cover - the row lock above makes this unreachable
        raise WorkItemConflict(_not_running_for(item_id, worker), code="conflict")
    events_copy_rows(
        [
            event_row(
                kind=f"work_item.{outcome}",
                subject_type=SUBJECT,
                subject_id=item_id,
                now=now,
                actor=worker,
                reason=reason,
                pool_id=item.pool_id,
                host_id=item.host_id,
                data={"from": WorkState.RUNNING, "to": outcome, "kind": item.kind},
            )
        ]
    )
    item.refresh_from_db()
    log.info(
        "work item reported %s",
        outcome,
        extra={
            "work_item_id": item_id,
            "host_id": item.host_id,
            "task_id": item.host_task_id,
            "pool_id": item.pool_id,
            "worker": worker,
            "outcome": outcome,
        },
    )
    return item


@transaction.atomic
def work_item_report_claim_next(
    *,
    item_id: int,
    worker: str,
    key: str,
    outcome: str,
    result: dict[str, Any] | None = None,
    reason: str = "",
    attempt: int | None = None,
    kinds: list[str] | None = None,
    lease_seconds: int = 300,
) -> tuple[WorkItem, WorkItem | None]:
    """`work_item_report`, then (when it was not a retry) claim the next ready item of the same host:
    one round trip for an adapter that works host by host. A retried report claims nothing."""
    locked = WorkItem.objects.select_for_update().filter(pk=item_id).values_list("report_key", flat=True).first()
    retried = locked == key  # read under the row lock: a concurrent same report waits, then claims nothing
    item = work_item_report(
        item_id=item_id, worker=worker, key=key, outcome=outcome, result=result, reason=reason, attempt=attempt
    )
    if retried:
        return item, None
    (following,) = work_item_claim_next(
        worker=worker, hosts=[(item.host_id, item.adapter)], kinds=kinds, lease_seconds=lease_seconds
    )
    return item, following


def work_item_claim_next(
    *,
    worker: str,
    hosts: Sequence[tuple[int, str]],
    kinds: list[str] | None = None,
    lease_seconds: int = 300,
) -> list[WorkItem | None]:
    """The next ready item of each (host, adapter) (None where there is none), claimed for `worker`:
    an adapter only ever gets the items of its own kind of adapter."""
    claimed = []
    for host_id, adapter in hosts:
        items = work_items_claim(
            worker=worker, adapter=adapter, kinds=kinds, host_id=host_id, limit=1, lease_seconds=lease_seconds
        )
        claimed.append(items[0] if items else None)
    return claimed

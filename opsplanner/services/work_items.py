"""Executors and drainers claim ready work items, heartbeat, and report the outcome.

Claiming is safe with many claimers at once (FOR UPDATE SKIP LOCKED on PostgreSQL; SQLite runs
writers one at a time). A report carries an idempotency key: the same report again returns the
first answer and changes nothing; a different report for a finished item is a conflict.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
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
    wanted = {"pool_id": pool_id, "host_id": host_id}
    ready = _ready_ids(adapter, tuple(kinds or ()), pool_id is not None, host_id is not None, limit)
    ids = [row[0] for row in ready.rows(**{name: value for name, value in wanted.items() if value is not None})]
    if not ids:
        return []
    now = clock.now()
    _CLAIM.count(ids=ids, worker=worker[:150], now=now, expires=now + dt.timedelta(seconds=lease_seconds))
    items = _claimed(only).objects(ids=ids)
    actor = worker[:150]
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
    """The ids of the first `limit` ready items a claim may take, locked, skipping those another
    claim holds; compiled once per shape of claim (claimers poll it all day)."""
    params: dict[str, ParamKind] = {
        name: int for name, wanted in (("pool_id", by_pool), ("host_id", by_host)) if wanted
    }

    def build(*, pool_id: int | None = None, host_id: int | None = None) -> QuerySet[WorkItem, tuple[int]]:
        ready = _ready(adapter=adapter, kinds=list(kinds), pool_id=pool_id, host_id=host_id)
        return ready.order_by("id").select_for_update(skip_locked=True).values_list("id")[:limit]

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


# Batches: many items in one request, each answered on its own --------------------------------------


@dataclass(frozen=True)
class ItemReport:
    """One outcome of a batch report: the item, the attempt its claim returned, and its report key."""

    item_id: int
    attempt: int
    outcome: str
    key: str
    result: dict[str, Any]
    reason: str = ""


@dataclass(frozen=True)
class ItemAnswer:
    """What became of one item of a batch: accepted, duplicate (this key was already applied),
    refused (with the code and message the single call would have raised) or extended (a heartbeat)."""

    item_id: int
    status: str
    code: str = ""
    detail: str = ""
    host_id: int | None = None
    lease_expires_at: dt.datetime | None = None
    adapter: str = ""


def _refusal(error: ValidationError) -> tuple[str, str]:
    """The code of a service's refusal (`invalid` when it has none) and its messages."""
    if not hasattr(error, "error_dict"):
        codes = [e.code for e in error.error_list if e.code]
        return (codes[0] if codes else "invalid"), " ".join(error.messages)
    codes, parts = [], []
    for field, errors in error.error_dict.items():
        messages = " ".join(message for e in errors for message in e.messages)
        parts.append(messages if field == "__all__" else f"{field}: {messages}")
        codes += [e.code for e in errors if e.code]
    return (codes[0] if codes else "invalid"), "; ".join(parts)


# What a batch report reads of each item, under its row lock (the checks, the event, the answer).
_REPORT_FIELDS: tuple[str, ...] = ("id", "state", "claimed_by", "attempts", "report_key", "kind", "params")
_REPORT_FIELDS += ("pool_id", "host_id", "host_task_id", "adapter")


@transaction.atomic
def work_items_report_batch(
    *, worker: str, reports: Sequence[ItemReport], adapters: Sequence[str] | None = None
) -> list[ItemAnswer]:
    """Report many outcomes in one transaction, set-based: the rows are locked first, in id order
    (two batches over the same items never deadlock), each report is checked as `work_item_report`
    checks one (a refused item, unknown, not ours, stale attempt, finished under another key or a
    bad result, is answered with its code and leaves the others alone), then the accepted ones are
    written by one UPDATE and their events by one COPY. An item whose report key is already this
    one is a duplicate and changes nothing. With `adapters`, items of other adapters do not exist
    for the caller. Answers are in the order of `reports`."""
    if len(reports) > MAX_BATCH:
        raise ValidationError({"reports": f"Report at most {MAX_BATCH} items at a time."})
    rows = WorkItem.objects.filter(pk__any=sorted({report.item_id for report in reports}))
    if adapters is not None:
        rows = rows.filter(adapter__in=adapters)
    items = {item.pk: item for item in rows.order_by("id").select_for_update().only(*_REPORT_FIELDS)}
    now = clock.now()
    accepted: dict[int, WorkItem] = {}
    answers = [_batch_answer(items.get(report.item_id), report, worker, now, accepted) for report in reports]
    if accepted:
        _batch_write(list(accepted.values()), worker, now)
    return answers


def _batch_answer(
    item: WorkItem | None, report: ItemReport, worker: str, now: dt.datetime, accepted: dict[int, WorkItem]
) -> ItemAnswer:
    """One report of a batch, checked against its locked item (as changed by the batch's earlier
    reports, so a second report of one item is a duplicate or a conflict, as it would be alone)."""
    if item is None:
        return ItemAnswer(report.item_id, REFUSED, "not_found", f"There is no work item #{report.item_id}.")
    if report.key and item.report_key == report.key:
        return ItemAnswer(report.item_id, DUPLICATE)
    try:
        _validate_key(report.key)
        _check_report(
            item,
            worker=worker,
            outcome=report.outcome,
            result=report.result,
            attempt=report.attempt,
            reason=report.reason,
        )
    except ValidationError as error:
        return ItemAnswer(report.item_id, REFUSED, *_refusal(error))
    item.state, item.result, item.report_key = report.outcome, report.result, report.key
    item.outcome_reason, item.finished_at = report.reason[:500], now
    accepted[item.pk] = item
    return ItemAnswer(item.pk, ACCEPTED, host_id=item.host_id, adapter=item.adapter)


def _batch_write(items: list[WorkItem], worker: str, now: dt.datetime) -> None:
    # The rows are locked by this transaction and were checked running for `worker`: no guard needed.
    _outcomes_update(items, now)
    events_copy_rows(
        [
            event_row(
                kind=f"work_item.{item.state}",
                subject_type=SUBJECT,
                subject_id=item.pk,
                now=now,
                actor=worker,
                reason=item.outcome_reason,
                pool_id=item.pool_id,
                host_id=item.host_id,
                data={"from": WorkState.RUNNING, "to": item.state, "kind": item.kind},
            )
            for item in items
        ]
    )
    if log.isEnabledFor(logging.INFO):
        for item in items:
            log.info(
                "work item reported %s",
                item.state,
                extra={
                    "work_item_id": item.pk,
                    "host_id": item.host_id,
                    "task_id": item.host_task_id,
                    "pool_id": item.pool_id,
                    "worker": worker,
                    "outcome": item.state,
                },
            )


def _outcomes_update(items: list[WorkItem], now: dt.datetime) -> None:
    """Write the accepted outcomes: on PostgreSQL one UPDATE … FROM unnest() of the batch's arrays
    (Django's bulk_update builds a CASE per column and row, about a second of CPU for 500 rows)."""
    if connection.vendor != "postgresql":
        WorkItem.objects.bulk_update(items, ["state", "result", "report_key", "outcome_reason", "finished_at"])
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {WorkItem._meta.db_table} AS item SET state = rows.state, result = rows.result, "
            "report_key = rows.report_key, outcome_reason = rows.reason, finished_at = %s "
            "FROM unnest(%s::bigint[], %s::text[], %s::jsonb[], %s::text[], %s::text[]) "
            "AS rows (id, state, result, report_key, reason) WHERE item.id = rows.id",
            [
                now,
                [item.pk for item in items],
                [item.state for item in items],
                [json.dumps(item.result) for item in items],
                [item.report_key for item in items],
                [item.outcome_reason for item in items],
            ],
        )


@transaction.atomic
def work_items_heartbeat_batch(
    *,
    worker: str,
    attempts: Sequence[tuple[int, int]],
    lease_seconds: int = 300,
    adapters: Sequence[str] | None = None,
) -> list[ItemAnswer]:
    """Extend the leases of many items we run, given as (item id, attempt), set-based: the rows are
    locked in id order and those still running for us on that attempt extended by one UPDATE. The
    others are refused as `work_item_heartbeat` refuses one (`not_found`, or `conflict` with the
    reason: taken back, finished, another attempt or claimer), so the adapter stops them. With
    `adapters`, items of other adapters do not exist for the caller."""
    if len(attempts) > MAX_BATCH:
        raise ValidationError({"items": f"Heartbeat at most {MAX_BATCH} items at a time."})
    _validate_claim(1, lease_seconds, None)
    expires = clock.now() + dt.timedelta(seconds=lease_seconds)
    ids = sorted({item_id for item_id, _ in attempts})
    found = WorkItem.objects.filter(pk__any=ids)
    if adapters is not None:
        found = found.filter(adapter__in=adapters)
    rows = {
        row[0]: row[1:]
        for row in found.order_by("id").select_for_update().values_list("id", "state", "claimed_by", "attempts")
    }
    mine = {
        (item_id, attempt) for item_id, attempt in attempts if rows.get(item_id) == (WorkState.RUNNING, worker, attempt)
    }
    if mine:
        WorkItem.objects.filter(
            pk__any=sorted(item_id for item_id, _ in mine), state=WorkState.RUNNING, claimed_by=worker
        ).update(lease_expires_at=expires)
    return [
        ItemAnswer(item_id, EXTENDED, lease_expires_at=expires)
        if (item_id, attempt) in mine
        else ItemAnswer(
            item_id,
            REFUSED,
            "conflict" if item_id in rows else "not_found",
            _not_running_message(item_id, rows.get(item_id), worker, attempt),
        )
        for item_id, attempt in attempts
    ]


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

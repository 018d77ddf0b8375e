"""Batches of work-item reports and heartbeats: many items in one request, each answered on its own.

A module of its own to keep work_items.py, which holds the single-item calls and the checks a batch
shares with them, under the project's file-size guideline.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection, transaction

from opsplanner import clock
from opsplanner.events import event_row, events_copy_rows
from opsplanner.models import WorkItem, WorkState
from opsplanner.services.work_items import (
    ACCEPTED,
    DUPLICATE,
    EXTENDED,
    MAX_BATCH,
    REFUSED,
    SUBJECT,
    _check_report,
    _not_running_message,
    _validate_claim,
    _validate_key,
    log,  # a batch report logs as a single report does, under the work_items logger
)


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

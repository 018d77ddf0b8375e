"""Executors and drainers claim ready work items, heartbeat, and report the outcome.

Claiming is safe with many claimers at once (FOR UPDATE SKIP LOCKED on PostgreSQL; SQLite runs
writers one at a time). A report carries an idempotency key: the same report again returns the
first answer and changes nothing; a different report for a finished item is a conflict.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F

from opsplanner import clock
from opsplanner.events import event_row, events_bulk_create, events_copy_rows
from opsplanner.models import Adapter, WorkItem, WorkKind, WorkState

SUBJECT = "opsplanner.workitem"
MAX_CLAIM = 1000
MAX_LEASE_SECONDS = 24 * 3600


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
) -> list[WorkItem]:
    """Claim up to `limit` ready items; each stays ours while we heartbeat before its lease ends.
    `only` loads just those fields of the claimed items (the simulator claims thousands an hour)."""
    if not worker:
        raise ValidationError({"worker": "Say who is claiming (a worker name)."})
    _validate_claim(limit, lease_seconds, kinds)
    ready = WorkItem.objects.filter(state=WorkState.READY, adapter=adapter)
    if kinds:
        ready = ready.filter(kind__in=kinds)
    if pool_id is not None:
        ready = ready.filter(pool_id=pool_id)
    ids = list(ready.order_by("id").select_for_update(skip_locked=True).values_list("id", flat=True)[:limit])
    if not ids:
        return []
    now = clock.now()
    expires = now + dt.timedelta(seconds=lease_seconds)
    WorkItem.objects.filter(pk__any=ids, state=WorkState.READY).update(
        state=WorkState.RUNNING,
        claimed_by=worker[:150],
        claimed_at=now,
        lease_expires_at=expires,
        attempts=F("attempts") + 1,
    )
    claimed = WorkItem.objects.filter(pk__any=ids).order_by("id")
    if only is not None:
        claimed = claimed.only("id", "kind", "attempts", "pool_id", "host_id", *only)
    items = list(claimed)
    actor = worker[:150]
    events_copy_rows(
        [
            (
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
    if item is None:
        return f"There is no work item #{item_id}."
    state, holder, attempts = item
    if state == WorkState.RUNNING and holder == worker and attempt is not None and attempt != attempts:
        return f"Work item #{item_id} is on attempt {attempts}; the claim of attempt {attempt} expired."
    if state == WorkState.RUNNING:
        return f"Work item #{item_id} is running for {holder}, not for {worker}."
    return f"Work item #{item_id} is {state}, not running for {worker} (its lease may have expired)."


def _validate_result(item: WorkItem, outcome: str, result: dict[str, Any]) -> None:
    if outcome not in (WorkState.DONE, WorkState.FAILED):
        raise ValidationError({"outcome": "The outcome is 'done' or 'failed'."})
    if not isinstance(result, dict):
        raise ValidationError({"result": "The result is an object."})
    versions = result.get("versions", {})
    if not isinstance(versions, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in versions.items()
    ):
        raise ValidationError({"result": "result.versions maps component names to version strings."})
    if item.kind == WorkKind.VERIFY and outcome == WorkState.DONE and not isinstance(result.get("passed"), bool):
        raise ValidationError({"result": "A verification report says result.passed: true or false."})
    if item.kind == WorkKind.EXECUTE and outcome == WorkState.DONE and item.params.get("component"):
        reported = versions.get(item.params["component"])
        if reported is None:
            raise ValidationError(
                {"result": f"An upgrade report gives result.versions[{item.params['component']!r}], the new version."}
            )


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
    if not key or len(key) > 128:
        raise ValidationError({"key": "Give an idempotency key of 1 to 128 characters."})
    result = result if result is not None else {}
    item = WorkItem.objects.select_for_update().filter(pk=item_id).first()
    if item is None:
        raise WorkItemConflict(f"There is no work item #{item_id}.", code="not_found")
    if item.report_key == key:
        return item  # a retried report: same answer, no change
    if item.state in (WorkState.DONE, WorkState.FAILED):
        raise WorkItemConflict(
            f"Work item #{item_id} was already reported {item.state} with another key.", code="conflict"
        )
    if item.state != WorkState.RUNNING or item.claimed_by != worker:
        raise WorkItemConflict(_not_running_for(item_id, worker), code="conflict")
    if attempt is not None and attempt != item.attempts:
        raise WorkItemConflict(
            f"Work item #{item_id} is on attempt {item.attempts}; the claim of attempt {attempt} expired.",
            code="conflict",
        )
    _validate_result(item, outcome, result)
    now = clock.now()
    changed = WorkItem.objects.filter(pk=item_id, state=WorkState.RUNNING, claimed_by=worker).update(
        state=outcome, result=result, report_key=key, outcome_reason=reason[:500], finished_at=now
    )
    if changed != 1:  # pragma: no cover - the row lock above makes this unreachable
        raise WorkItemConflict(_not_running_for(item_id, worker), code="conflict")
    events_bulk_create(
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

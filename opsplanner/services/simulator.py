"""The simulated drainer and executor: adapters like any other, claiming and reporting in batches.

Durations and failure rates come from SimulatorProfile; outcomes are a hash of the seed, the item
and the attempt, so the same seed gives the same run.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable

from django.conf import settings
from django.db import transaction

from opsplanner import clock
from opsplanner.events import event_row, events_bulk_create
from opsplanner.models import Adapter, SimulatorProfile, WorkItem, WorkKind, WorkState
from opsplanner.services.work_items import work_items_claim

WORKER = "simulator"
LEASE_GRACE_S = 120


def chance(*parts: object) -> float:
    """A number in [0, 1) fixed by its parts: deterministic randomness."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _duration(profile: SimulatorProfile, item: WorkItem) -> float:
    if item.kind == WorkKind.DRAIN:
        slow = chance(profile.seed, "slow", item.host_id) < float(profile.slow_host_fraction)
        return profile.drain_seconds * (profile.slow_drain_factor if slow else 1.0)
    return {
        WorkKind.EXECUTE: profile.execute_seconds,
        WorkKind.VERIFY: profile.verify_seconds,
        WorkKind.UNDRAIN: profile.undrain_seconds,
    }[item.kind]


def _outcome(profile: SimulatorProfile, item: WorkItem) -> tuple[str, dict, str]:
    """(state, result, reason) for a simulated item."""
    if item.kind == WorkKind.DRAIN:
        if chance(profile.seed, "refuse", item.host_id) < float(profile.refusing_host_fraction):
            return WorkState.FAILED, {}, f"the simulated drainer refuses host {item.host_id}"
        return WorkState.DONE, {}, ""
    if item.kind == WorkKind.EXECUTE:
        if chance(profile.seed, "execute", item.pk, item.attempts) < float(profile.execute_failure_rate):
            return WorkState.FAILED, {}, f"simulated {item.params.get('kind', 'execution')} failure"
        versions = {item.params["component"]: item.params["version"]} if item.params.get("component") else {}
        return WorkState.DONE, {"versions": versions}, ""
    if item.kind == WorkKind.VERIFY:
        passed = chance(profile.seed, "verify", item.pk, item.attempts) >= float(profile.verify_failure_rate)
        detail = "" if passed else f"simulated {item.verify_class} check failed"
        return WorkState.DONE, {"passed": passed, "detail": detail}, detail
    return WorkState.DONE, {}, ""


def simulated_work_step(*, limit: int | None = None) -> int:
    """Claim ready simulated items (they become due after their simulated duration) and finish
    the running ones that are due. Returns how many items were finished."""
    profile = SimulatorProfile.current()
    batch = limit or profile.batch_size
    _claim(profile, batch)
    return _finish_due(profile, batch)


def _claim(profile: SimulatorProfile, batch: int) -> None:
    with transaction.atomic():
        items = work_items_claim(worker=WORKER, adapter=Adapter.SIMULATED, limit=batch, lease_seconds=3600)
        if not items:
            return
        for item in items:
            duration = _duration(profile, item)
            item.due_at = item.claimed_at + dt.timedelta(seconds=duration)
            item.lease_expires_at = item.due_at + dt.timedelta(seconds=LEASE_GRACE_S)
        WorkItem.objects.bulk_update(items, ["due_at", "lease_expires_at"])


def _finish_due(profile: SimulatorProfile, batch: int) -> int:
    with transaction.atomic():
        now = clock.now()
        due = list(
            WorkItem.objects.filter(
                state=WorkState.RUNNING, adapter=Adapter.SIMULATED, claimed_by=WORKER, due_at__lte=now
            )
            .order_by("due_at", "id")
            .select_for_update(skip_locked=True)[:batch]
        )
        if not due:
            return 0
        events = []
        for item in due:
            item.state, item.result, item.outcome_reason = _outcome(profile, item)
            item.finished_at = now
            item.report_key = f"simulator:{item.pk}:{item.attempts}"
            events.append(
                event_row(
                    kind=f"work_item.{item.state}",
                    subject_type="opsplanner.workitem",
                    subject_id=item.pk,
                    now=now,
                    actor=WORKER,
                    reason=item.outcome_reason,
                    pool_id=item.pool_id,
                    host_id=item.host_id,
                    data={"from": WorkState.RUNNING, "to": item.state, "kind": item.kind},
                )
            )
        WorkItem.objects.bulk_update(due, ["state", "result", "outcome_reason", "finished_at", "report_key"])
        events_bulk_create(events)
        pools = {item.pool_id for item in due}
        if settings.KICK_TASKS:
            transaction.on_commit(lambda: _kick_ticks(pools))
        return len(due)


def _kick_ticks(pool_ids: Iterable[int]) -> None:
    from opsplanner.tasks import pool_tick

    for pool_id in pool_ids:
        pool_tick.delay(pool_id)

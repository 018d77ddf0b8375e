"""The simulated drainer and executor: adapters like any other, claiming and reporting in batches.

Durations and failure rates come from SimulatorProfile; outcomes are a hash of the seed, the item
and the attempt, so the same seed gives the same run.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import json
import math
from collections.abc import Iterable
from decimal import Decimal
from statistics import NormalDist
from typing import Any, NamedTuple, Protocol

from django.conf import settings
from django.db import transaction

from opsplanner import clock
from opsplanner.bulk import update_rows
from opsplanner.events import EventRow, events_copy_rows
from opsplanner.models import Adapter, SimulatorProfile, WorkItem, WorkKind, WorkState
from opsplanner.prepared import PreparedQuery
from opsplanner.services.work_items import MAX_CLAIM, work_items_claim

WORKER = "simulator"
LEASE_GRACE_S = 120
SUBJECT = "opsplanner.workitem"
# What working out durations and outcomes reads: loading whole items (eight timestamps each) cost
# more than the rest of the simulated executor.
_CLAIM_FIELDS = ("params", "claimed_at")
SPREAD_Z_BOUND = 3.0  # a host is at most e^(3 sigma) slower or faster than the median: no absurd outlier
# The log-normal spread of each host's durations around the profile's (sigma; 0: every host alike).
# Set by the simulation for the process it runs in (simulation/scenarios.py); not a profile column.
_host_spread = 0.0
_NORMAL = NormalDist()


def simulator_host_spread_set(sigma: float) -> None:
    """Every simulated host takes its own time for each kind of work: a log-normal factor of spread
    `sigma` (mean 1), fixed by the seed, the host and the kind. 0 switches the spread off."""
    if not isinstance(sigma, int | float) or isinstance(sigma, bool) or not 0 <= sigma <= 3:
        raise ValueError(f"the host spread must be a number from 0 to 3; got {sigma!r}")
    global _host_spread
    _host_spread = float(sigma)


def host_spread_factor(seed: int, host_id: int | None, kind: str, sigma: float | None = None) -> float:
    """How much longer (or shorter) this host takes for this kind of work than the profile says: a
    log-normal factor with mean 1 (median below 1), its normal draw bounded to ±SPREAD_Z_BOUND;
    exactly 1 without a spread. Deterministic: the seed, the host and the kind decide."""
    sigma = _host_spread if sigma is None else sigma
    if not sigma or host_id is None:
        return 1.0
    u = min(max(chance(seed, "spread", host_id, kind), 1e-12), 1 - 1e-12)
    z = max(-SPREAD_Z_BOUND, min(SPREAD_Z_BOUND, _NORMAL.inv_cdf(u)))
    return math.exp(sigma * z - sigma * sigma / 2)


def chance(*parts: object) -> float:
    """A number in [0, 1) fixed by its parts: deterministic randomness."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class _Item(Protocol):
    """What working out a simulated item's duration and outcome reads: a claimed WorkItem, or a due
    item's row (_Due)."""

    @property
    def pk(self) -> Any: ...
    @property
    def kind(self) -> str: ...
    @property
    def verify_class(self) -> str: ...
    @property
    def host_id(self) -> int | None: ...
    @property
    def attempts(self) -> int: ...
    @property
    def params(self) -> Any: ...


def _duration(profile: SimulatorProfile, item: _Item) -> float:
    """How long the item takes: the profile's time, times the host's own factor for this kind of
    work. A slow host's drain takes slow_drain_factor times the profile's, spread or not (that
    factor is the tail of the drains, set against the drain deadline; spread again, it broke it)."""
    if item.kind == WorkKind.DRAIN and _slow(profile, item.host_id):
        return profile.drain_seconds * profile.slow_drain_factor
    return _base_duration(profile, item) * host_spread_factor(profile.seed, item.host_id, item.kind)


def _slow(profile: SimulatorProfile, host_id: int | None) -> bool:
    return chance(profile.seed, "slow", host_id) < float(profile.slow_host_fraction)


def _base_duration(profile: SimulatorProfile, item: _Item) -> float:
    if item.kind == WorkKind.DRAIN:
        return profile.drain_seconds
    if item.kind == WorkKind.EXECUTE:
        return _execution(profile, item)[0]
    seconds: dict[str, float] = {
        WorkKind.VERIFY: profile.verify_seconds,
        WorkKind.UNDRAIN: profile.undrain_seconds,
    }
    return seconds[item.kind]


def _outcome(profile: SimulatorProfile, item: _Item) -> tuple[str, dict, str]:
    """(state, result, reason) for a simulated item."""
    if item.kind == WorkKind.DRAIN:
        if chance(profile.seed, "refuse", item.host_id) < float(profile.refusing_host_fraction):
            return WorkState.FAILED, {}, f"the simulated drainer refuses host {item.host_id}"
        return WorkState.DONE, {}, ""
    if item.kind == WorkKind.EXECUTE:
        if chance(profile.seed, "execute", item.pk, item.attempts) < _execution(profile, item)[1]:
            return WorkState.FAILED, {}, f"simulated {item.params.get('kind', 'execution')} failure"
        versions = {item.params["component"]: item.params["version"]} if item.params.get("component") else {}
        versions.update(item.params.get("restore") or {})  # a repair rolls back withdrawn versions
        return WorkState.DONE, {"versions": versions}, ""
    if item.kind == WorkKind.VERIFY:
        passed = chance(profile.seed, "verify", item.pk, item.attempts) >= float(profile.verify_failure_rate)
        detail = "" if passed else f"simulated {item.verify_class} check failed"
        return WorkState.DONE, {"passed": passed, "detail": detail}, detail
    return WorkState.DONE, {}, ""


def _execution(profile: SimulatorProfile, item: _Item) -> tuple[float, float]:
    params = item.params
    return profile.execution(params.get("kind", ""), params.get("component", ""), params.get("version", ""))


def simulator_profile_instant(**overrides: object) -> SimulatorProfile:
    """Zero-duration simulated drains, executions and checks with no failures, then the overrides
    (for tests and benchmarks that measure the orchestrator, not the simulated hardware)."""
    profile = SimulatorProfile.current()
    profile.drain_seconds = profile.execute_seconds = profile.verify_seconds = profile.undrain_seconds = 0.0
    for name in ("slow_host_fraction", "refusing_host_fraction", "execute_failure_rate", "verify_failure_rate"):
        setattr(profile, name, Decimal(0))
    profile.execute_by_kind = {}
    simulator_host_spread_set(0.0)
    for name, value in overrides.items():
        if isinstance(value, float) and name.endswith(("_fraction", "_rate")):
            value = Decimal(str(value))  # 0.05, not 0.05000000000000000277
        setattr(profile, name, value)
    profile.full_clean()
    profile.save()
    return profile


def simulated_work_step(*, limit: int | None = None, profile: SimulatorProfile | None = None) -> int:
    """Claim ready simulated items (they become due after their simulated duration) and finish
    the running ones that are due. Returns how many items were finished. A caller that steps many
    times while nothing changes the profile (the simulation, within one instant) passes it."""
    profile = profile or SimulatorProfile.current()
    simulated_work_claim(profile=profile, limit=limit)
    return simulated_work_finish(profile=profile, limit=limit)


def simulated_work_claim(*, profile: SimulatorProfile, limit: int | None = None) -> dt.datetime | None:
    """The claiming half of simulated_work_step: when the first item it claimed is due (None: it
    claimed nothing). The simulation, which knows when nothing is ready or due, calls the halves
    apart so as not to ask for nothing (a transaction each)."""
    return _claim(profile, limit or profile.batch_size)


def simulated_work_finish(*, profile: SimulatorProfile, limit: int | None = None) -> int:
    """The finishing half of simulated_work_step: how many due items it finished."""
    return _finish_due(profile, limit or profile.batch_size)


def _claim(profile: SimulatorProfile, batch: int) -> dt.datetime | None:
    with transaction.atomic():
        items: list[WorkItem] = []
        while len(items) < batch:
            chunk = min(batch - len(items), MAX_CLAIM)
            claimed = work_items_claim(
                worker=WORKER, adapter=Adapter.SIMULATED, limit=chunk, lease_seconds=3600, only=_CLAIM_FIELDS
            )
            items.extend(claimed)
            if len(claimed) < chunk:
                break
        if not items:
            return None
        claimed_at = items[0].claimed_at
        assert claimed_at is not None  # work_items_claim sets it on every item it claims
        grace = dt.timedelta(seconds=LEASE_GRACE_S)
        dues = []
        for item in items:
            duration = _duration(profile, item)
            # With a spread every host differs: due on a whole second, as runs have always been.
            due = claimed_at + dt.timedelta(seconds=round(duration) if _host_spread else duration)
            dues.append((item.pk, due, due + grace))
        update_rows(WorkItem, ["due_at", "lease_expires_at"], dues)
        return min(due for _, due, _ in dues)


class _Due(NamedTuple):
    """What finishing a simulated item reads of it."""

    pk: int
    kind: str
    verify_class: str
    host_id: int
    pool_id: int
    attempts: int
    params: dict[str, Any]


@functools.lru_cache(maxsize=8)
def _due_items(batch: int) -> PreparedQuery:
    """The first `batch` simulated items whose time has come, locked (compiled once: every step asks)."""
    return PreparedQuery(
        lambda *, now: (
            WorkItem.objects.filter(
                state=WorkState.RUNNING, adapter=Adapter.SIMULATED, claimed_by=WORKER, due_at__lte=now
            )
            .order_by("due_at", "id")
            .select_for_update(skip_locked=True)
            .values_list(*_Due._fields)[:batch]
        ),
        now=dt.datetime,
    )


def _finish_due(profile: SimulatorProfile, batch: int) -> int:
    with transaction.atomic():
        now = clock.now()
        due = [_Due(*row) for row in _due_items(batch).rows(now=now)]
        if not due:
            return 0
        events, finished = [], []
        for item in due:
            state, result, reason = _outcome(profile, item)
            finished.append((item.pk, state, result, reason, now, f"{WORKER}:{item.pk}:{item.attempts}"))
            data = json.dumps({"from": WorkState.RUNNING, "to": state, "kind": item.kind})
            events.append(
                EventRow(
                    now, f"work_item.{state}", None, WORKER, SUBJECT, item.pk, item.pool_id, item.host_id, reason, data
                )
            )
        update_rows(
            WorkItem,
            ["state", "result", "outcome_reason", "finished_at", "report_key"],
            finished,
            where={"state": WorkState.RUNNING},
        )
        events_copy_rows(events)
        pools = {item.pool_id for item in due}
        if settings.KICK_TASKS:
            transaction.on_commit(lambda: _kick_ticks(pools))
        return len(due)


def _kick_ticks(pool_ids: Iterable[int]) -> None:
    from opsplanner.tasks import pool_tick

    for pool_id in pool_ids:
        pool_tick.delay(pool_id)

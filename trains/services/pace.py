"""The sliding pace: hosts return as each finishes and hosts of the next domain start.

A domain-paced train (`pace = "domain"`) hands a whole visit to the core at once and starts the next
domain when the visit's last host is back. A sliding train (`pace = "sliding"`) plans each visit the
same way (budget, newest version per component, phases) but releases the visit's hosts to the core a
few at a time: each train tick it releases as many hosts as the visit's worth allows, counting the
hosts it already has out (an open task of its visits, pending ones included, or the lease of one
whose drain failed), first the not yet released hosts of its running visits (in the train's order),
then the hosts of the next domains. A host drained since its visit started (a repair, other work)
had its drain of the cycle: it is left for its next visit, as a domain-paced visit defers its task.

The allowance is the visit's worth: the largest domain x visit_concurrency, or the planned buffer if
that is smaller. The core's admission keeps the hard limits (the planned buffer, the floor, the
reservations, opt-out windows): a released host the buffer has no room for waits in its queue, and
counts as out for the train, so the train releases no more. A cycle is still every domain visited.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from django.db.models import Count, Exists, F, OuterRef, QuerySet

from fleet.models import Host, HostState
from fleet.selectors.capacity import pool_capacity
from opsplanner.events import event_record
from opsplanner.models import OPEN_TASK_STATES, HostTask, Lease
from opsplanner.prepared import PreparedQuery
from trains.models import Pace, Train, TrainStop, Upgrade, UpgradePhase, Visit, VisitState
from trains.services.actor import ACTOR
from trains.services.visits import (
    Step,
    UpgradePlan,
    split_release,
    unreleased_hosts,
    visit_plan_record_refused,
    visit_steps_submit_compatible,
)


def train_slides(train: Train) -> bool:
    return train.pace == Pace.SLIDING


# Asked at every tick of a sliding train: compiled once (opsplanner/prepared.py).
_DOMAIN_SIZES = PreparedQuery(
    lambda *, train_id: (
        Host.objects.filter(domain_id__in=TrainStop.objects.filter(train_id=train_id).values("domain_id"))
        .order_by()
        .values("domain_id")
        .annotate(n=Count("id"))
        .values_list("domain_id", "n")
    ),
    train_id=int,
)


def sliding_allowance(train: Train) -> int:
    """How many hosts a sliding train may have out at once (two queries): the largest domain x
    visit_concurrency, or the planned buffer if smaller (an emergency train ignores the buffer); at
    least one, so the train shows its work waiting in the core's queue rather than idling silently."""
    largest = max((n for _, n in _DOMAIN_SIZES.rows(train_id=train.pk)), default=0)
    allowed = largest * train.visit_concurrency
    if not train.emergency:
        allowed = min(allowed, pool_capacity(train.pool).buffers.planned)
    return max(1, allowed)


def train_tasks(train_id: int) -> QuerySet[HostTask]:
    """The tasks of a train's visits, every visit of every cycle."""
    return HostTask.objects.filter(operation__visit_link__visit__train_id=train_id)


_HOSTS_OUT = PreparedQuery(
    lambda *, train_id: (
        train_tasks(train_id)
        .filter(state__in=OPEN_TASK_STATES)
        .order_by()
        .values_list("host_id")
        # A host whose drain failed returns with its task already failed, under that task's lease:
        # still out for the train until its undrain is done (uncounted, the next hosts went out too).
        .union(Lease.objects.filter(active=True, host_task__in=train_tasks(train_id)).order_by().values_list("host_id"))
    ),
    train_id=int,
)


def train_hosts_out(train: Train) -> int:
    """The hosts a train has out or released to the core: an open task of one of its visits, or the
    active lease of one (one query, at most a visit's worth of rows)."""
    return len(_HOSTS_OUT.rows(train_id=train.pk))


@dataclass(frozen=True)
class ActiveUpgrade:
    """What releasing needs of an upgrade still active: the row and its phases."""

    upgrade: Upgrade
    phases: list[UpgradePhase]


def visit_release(*, train: Train, visit: Visit, active: Mapping[int, ActiveUpgrade], limit: int) -> int:
    """Release up to `limit` more hosts of a running sliding visit to the core: one operation per
    upgrade over the released hosts, with the phase the visit planned it in. Hosts of an upgrade no
    longer active (offboarded, completed) are dropped. Returns how many hosts were released. Runs in
    the train tick's transaction."""
    pending = []
    for entry in visit.plan.get("unreleased", []):
        if known := active.get(entry["upgrade"]):
            plan = UpgradePlan(upgrade=known.upgrade, phase=known.phases[entry["phase"]], allowed=set())
            pending.append(Step(plan=plan, hosts=set(entry["hosts"]), work_s=entry["work_s"]))
    now, rest = split_release(pending, limit)
    # Planned maybe hours ago: a host retired, moved to another pool or broken since then is left for
    # its next visit (submitted anyway, the core refused a retired host and the tick rolled back at
    # every run; a moved one was drained by the old pool's train, a broken one held the visit open).
    ready = _releasable(visit, now)
    steps = [replace(s, hosts=s.hosts & ready) for s in pending if s.hosts & ready]
    plan_record = {**visit.plan, "unreleased": rest, "released": int(visit.plan.get("released", 0)) + len(ready)}
    if not Visit.objects.filter(pk=visit.pk, state=VisitState.RUNNING).update(plan=plan_record):
        return 0
    visit.plan = plan_record
    if steps:  # a target now incompatible is left out, and its hosts still to come no longer wait for it
        visit_plan_record_refused(visit, visit_steps_submit_compatible(train, visit, steps, joined=False))
    if now:
        _released_record(train, visit, released=len(ready), left_out=len(now - ready))
    return len(ready)


def _releasable(visit: Visit, host_ids: set[int]) -> set[int]:
    """The hosts among `host_ids` still in the visit's domain and in service (what a visit starts with),
    and not drained since the visit started. A drain since (a repair's, or other work's, failed or
    not) is the host's drain of this cycle: a domain-paced visit's task would have been handed over
    to it or deferred; released now, the host went out a second time in the cycle."""
    if not host_ids:
        return set()
    hosts = Host.objects.filter(pk__in=sorted(host_ids), domain_id=visit.domain_id, state=HostState.IN_SERVICE)
    if visit.started_at is not None:
        since = HostTask.objects.filter(host_id=OuterRef("pk"), drain_key=F("id"), admitted_at__gte=visit.started_at)
        hosts = hosts.filter(~Exists(since))
    return set(hosts.order_by().values_list("id", flat=True))


def _released_record(train: Train, visit: Visit, *, released: int, left_out: int) -> None:
    left = len(unreleased_hosts(visit))
    reason = (
        f"{released} more hosts of domain {visit.domain.name} released to the core as hosts came back; "
        f"{left} still to come"
    )
    if left_out:
        reason += (
            f"; {left_out} no longer in service in the domain, or drained since the visit started, left for their "
            "next visit"
        )
    event_record(
        kind="train.visit_released",
        subject=visit,
        actor=ACTOR,
        pool_id=train.pool_id,
        reason=reason,
        data={"train": train.pk, "cycle": visit.cycle_id, "hosts": released, "left": left, "left_out": left_out},
    )

"""Creating, pausing and resuming trains."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction

from fleet.models import Host, MaintenanceDomain, Pool
from opsplanner import clock
from opsplanner.adapters import POOLS_ADAPTER
from opsplanner.events import Actor, actor_user, event_record
from opsplanner.models import Operation, OperationState
from trains.models import STOPPED_TRAIN_STATES, Pace, Train, TrainState, TrainStop, VisitOperation, VisitState
from trains.models.trains import DEFAULT_TRAIN_PRIORITY
from trains.services.budget import visit_rounds

SUBJECT = "trains.train"


def _domains_in_order(pool: Pool, domain_order: list[str] | None) -> list[MaintenanceDomain]:
    domains = {d.name: d for d in MaintenanceDomain.objects.filter(pool=pool)}
    if domain_order is None:
        with_hosts = set(Host.objects.filter(pool=pool).values_list("domain_id", flat=True).distinct())
        ordered = sorted((d for d in domains.values() if d.pk in with_hosts), key=lambda d: (d.position, d.name))
        if not ordered:
            raise ValidationError({"domain_order": f"Pool {pool.name} has no domain with hosts to visit."})
        return ordered
    if not domain_order:
        raise ValidationError({"domain_order": "Give at least one domain to visit."})
    unknown = [name for name in domain_order if name not in domains]
    if unknown:
        raise ValidationError({"domain_order": f"Pool {pool.name} has no domain {', '.join(unknown)}."})
    repeated = sorted({name for name in domain_order if domain_order.count(name) > 1})
    if repeated:
        raise ValidationError(
            {"domain_order": f"Each domain is visited once per cycle; repeated: {', '.join(repeated)}."}
        )
    return [domains[name] for name in domain_order]


def _check_pace(pace: str | None) -> None:
    if pace is not None and pace not in Pace.values:
        raise ValidationError({"pace": f"A train's pace is {' or '.join(Pace.values)}, not {pace!r}."})


def slo_shortfall(*, stops: int, concurrency: int, visit_estimate_s: int, cycle_slo_s: int) -> str:
    """Why a cycle of `stops` visits cannot meet the SLO even at the train's visit estimate; empty
    when it can."""
    needed = visit_rounds(stops, concurrency) * visit_estimate_s
    if cycle_slo_s >= needed:
        return ""
    return (
        f"A cycle of {stops} visits of {visit_estimate_s} s, {concurrency} at a time, takes at least {needed} s; "
        f"the SLO of {cycle_slo_s} s cannot be met."
    )


def _check_slo(*, stops: int, concurrency: int, visit_estimate_s: int, cycle_slo_s: int) -> None:
    shortfall = slo_shortfall(
        stops=stops, concurrency=concurrency, visit_estimate_s=visit_estimate_s, cycle_slo_s=cycle_slo_s
    )
    if shortfall:
        raise ValidationError({"cycle_slo_s": shortfall})


@transaction.atomic
def train_create(
    *,
    pool: Pool,
    name: str,
    cycle_slo_s: int,
    visit_estimate_s: int = 3600,
    domain_order: list[str] | None = None,
    visit_concurrency: int = 1,
    priority: int = DEFAULT_TRAIN_PRIORITY,
    auto_resume_after_s: int | None = None,
    visit_overhead_s: int | None = None,
    executor: str = POOLS_ADAPTER,
    drainer: str = POOLS_ADAPTER,
    pace: str = Pace.DOMAIN,
    actor: Actor = None,
) -> Train:
    """A regular train over the pool's domains (all of them, by position, unless an order is given),
    domain-synchronous or sliding (`pace`, trains/services/pace.py)."""
    _check_pace(pace)
    if not isinstance(visit_concurrency, int) or visit_concurrency < 1:
        raise ValidationError({"visit_concurrency": "Visit at least one domain at a time."})
    if not isinstance(visit_estimate_s, int) or visit_estimate_s < 1:
        raise ValidationError({"visit_estimate_s": "A visit takes at least one second."})
    if not isinstance(cycle_slo_s, int) or cycle_slo_s < 1:
        raise ValidationError({"cycle_slo_s": "The cycle-time SLO is a positive number of seconds."})
    domains = _domains_in_order(pool, domain_order)
    _check_slo(
        stops=len(domains), concurrency=visit_concurrency, visit_estimate_s=visit_estimate_s, cycle_slo_s=cycle_slo_s
    )
    if Train.objects.filter(pool=pool, emergency=False).exists():
        raise ValidationError({"pool": f"Pool {pool.name} already has a train."})
    train = Train(
        name=name,
        pool=pool,
        cycle_slo_s=cycle_slo_s,
        visit_estimate_s=visit_estimate_s,
        visit_concurrency=visit_concurrency,
        priority=priority,
        auto_resume_after_s=auto_resume_after_s,
        visit_overhead_s=visit_overhead_s,
        executor=executor,
        drainer=drainer,
        pace=pace,
        created_by=actor_user(actor),
        state_changed_at=clock.now(),
    )
    train.full_clean()
    train.save()
    TrainStop.objects.bulk_create(
        [TrainStop(train=train, domain=domain, position=i) for i, domain in enumerate(domains)]
    )
    event_record(
        kind="train.created",
        subject=train,
        actor=actor,
        pool_id=pool.pk,
        data={
            "domains": [d.name for d in domains],
            "cycle_slo_s": cycle_slo_s,
            "concurrency": visit_concurrency,
            "pace": pace,
        },
    )
    return train


EDITABLE_TRAIN_STATES = frozenset({TrainState.RUNNING, TrainState.PAUSED, TrainState.AUTOSTOPPED})


@transaction.atomic
def train_update(
    *,
    train_id: int,
    cycle_slo_s: int | None = None,
    visit_concurrency: int | None = None,
    domain_order: list[str] | None = None,
    pace: str | None = None,
    actor: Actor,
) -> Train:
    """Change a regular train's SLO, concurrency, domain order or pace (None keeps a value). The open
    cycle keeps its deadline and its visits; the change applies from the next cycle (a new pace from
    the next visit to start). Nothing changed is no change: no event."""
    train = Train.objects.select_for_update(of=("self",)).select_related("pool").get(pk=train_id)
    if train.emergency:
        raise ValidationError(
            f"Train {train.name} is an emergency train: it runs as approved; request a new one instead.",
            code="conflict",
        )
    if train.state not in EDITABLE_TRAIN_STATES:
        raise ValidationError(f"Train {train.name} is {train.state}; only a live train is changed.", code="conflict")
    if visit_concurrency is not None and (not isinstance(visit_concurrency, int) or visit_concurrency < 1):
        raise ValidationError({"visit_concurrency": "Visit at least one domain at a time."})
    if cycle_slo_s is not None and (not isinstance(cycle_slo_s, int) or cycle_slo_s < 1):
        raise ValidationError({"cycle_slo_s": "The cycle-time SLO is a positive number of seconds."})
    _check_pace(pace)
    current = list(train.stops.select_related("domain").order_by("position"))
    before = {
        "cycle_slo_s": train.cycle_slo_s,
        "visit_concurrency": train.visit_concurrency,
        "domain_order": [stop.domain.name for stop in current],
        "pace": train.pace,
    }
    domains = _domains_in_order(train.pool, domain_order) if domain_order is not None else [s.domain for s in current]
    new_slo_s = train.cycle_slo_s if cycle_slo_s is None else cycle_slo_s
    new_concurrency = train.visit_concurrency if visit_concurrency is None else visit_concurrency
    new_pace = train.pace if pace is None else pace
    after = {
        "cycle_slo_s": new_slo_s,
        "visit_concurrency": new_concurrency,
        "domain_order": [d.name for d in domains],
        "pace": new_pace,
    }
    changed = sorted(key for key in before if before[key] != after[key])
    if not changed:
        return train
    _check_slo(
        stops=len(domains),
        concurrency=new_concurrency,
        visit_estimate_s=train.visit_estimate_s,
        cycle_slo_s=new_slo_s,
    )
    train.cycle_slo_s, train.visit_concurrency, train.pace = new_slo_s, new_concurrency, new_pace
    train.full_clean()
    train.save(update_fields=["cycle_slo_s", "visit_concurrency", "pace"])
    if "domain_order" in changed:
        _replace_stops(train, domains)
    event_record(
        kind="train.updated",
        subject=train,
        actor=actor,
        pool_id=train.pool_id,
        data={"before": {key: before[key] for key in changed}, "after": {key: after[key] for key in changed}},
    )
    from trains.services.upgrades import train_says_at_once  # upgrades.py imports this module

    train_says_at_once(train.pool)  # the budget and the deadlines, with the new numbers
    return train


def _replace_stops(train: Train, domains: list[MaintenanceDomain]) -> None:
    """The train's new domain order (the open cycle's visits were planned from the old one)."""
    TrainStop.objects.filter(train=train).delete()
    TrainStop.objects.bulk_create(
        [TrainStop(train=train, domain=domain, position=i) for i, domain in enumerate(domains)]
    )


def train_set_state(*, train: Train, expected: set[str], new: str, reason: str, actor: Actor, kind: str) -> bool:
    """Guarded transition; False when the train was not in an expected state (someone else won).
    Under the pool's tick lock (after the train's, the train tick's order): a pool tick judging its
    queue as a train stops finishes first, and the next sees the holds. Without it, a tick that read
    the queue before a pause committed admitted the paused train's hosts after it."""
    Pool.objects.select_for_update(no_key=True).filter(pk=train.pool_id).values_list("pk").first()
    now = clock.now()
    changed = Train.objects.filter(pk=train.pk, state__in=expected).update(
        state=new, state_reason=reason[:500], state_changed_at=now, recovered_since=None
    )
    if changed != 1:
        return False
    old = train.state
    train.state, train.state_reason, train.state_changed_at = new, reason[:500], now
    event_record(
        kind=kind, subject=train, actor=actor, reason=reason, pool_id=train.pool_id, data={"from": old, "to": new}
    )
    _set_holds(train, hold=f"train {train.name} is {new}: {reason}"[:300] if new in STOPPED_TRAIN_STATES else "")
    return True


def _set_holds(train: Train, *, hold: str) -> None:
    """A stopped train's visits admit no more hosts (hosts already out finish and return, their held
    work left for the next cycle: opsplanner/services/tick/advance.py, one drain per host per
    cycle); resumed, they do again. A paused train holds its catch-ups too (trains/services/catch_up.py), those of
    visits already ended included: an operator stopped its upgrades from spreading, and the host
    in repair returns without them (opsplanner/services/tick/repair.py). An autostopped one lets
    them be: a catch-up takes no host out, and the core hands it the repaired host only with room
    in the planned buffer."""
    links = VisitOperation.objects.filter(visit__train=train, operation__state=OperationState.OPEN)
    if hold and train.state != TrainState.PAUSED:
        links = links.filter(visit__state=VisitState.RUNNING, catch_up=False)
    Operation.objects.filter(pk__in=list(links.values_list("operation_id", flat=True))).update(hold_reason=hold)


@transaction.atomic
def train_pause(*, train_id: int, reason: str, actor: Actor) -> Train:
    if not reason or not reason.strip():
        raise ValidationError({"reason": "Say why the train is paused."})
    train = Train.objects.select_for_update().get(pk=train_id)
    if not train_set_state(
        train=train,
        expected={TrainState.RUNNING, TrainState.AUTOSTOPPED},
        new=TrainState.PAUSED,
        reason=reason.strip(),
        actor=actor,
        kind="train.paused",
    ):
        raise ValidationError(
            f"Train {train.name} is {train.state}; only a running or autostopped train pauses.",
            code="conflict",
        )
    return train


@transaction.atomic
def train_resume(*, train_id: int, reason: str, actor: Actor) -> Train:
    if not reason or not reason.strip():
        raise ValidationError({"reason": "Say why the train resumes."})
    train = Train.objects.select_for_update().get(pk=train_id)
    if not train_set_state(
        train=train,
        expected=set(STOPPED_TRAIN_STATES),
        new=TrainState.RUNNING,
        reason=reason.strip(),
        actor=actor,
        kind="train.resumed",
    ):
        raise ValidationError(
            f"Train {train.name} is {train.state}; only a paused or autostopped train resumes.",
            code="conflict",
        )
    return train

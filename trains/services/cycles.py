"""The train tick's fourth step: open a cycle when work is pending, start its visits (each sized to
its share of the time left in the cycle, trains/services/budget.py), skip domains under an opt-out
window for now, end visits and the cycle. Called under the train's row lock (trains/services/tick.py).
"""

from __future__ import annotations

import datetime as dt

from django.db.models import Max

from fleet.models import HostState, MaintenanceDomain
from opsplanner.events import event_record
from opsplanner.services.optouts import optouts_by_domain
from trains.models import Cycle, Train, TrainStop, Visit, VisitOperation, VisitState
from trains.selectors import pools_domain_hosts, stops_to_add
from trains.services.actor import ACTOR
from trains.services.budget import (
    VisitSizing,
    newest_cycle_number,
    sizing_within_cycle,
    sliding_in_flight_s,
    train_budget_check,
    train_sizing,
)
from trains.services.emergency import emergency_cycle_ended, emergency_within_reach
from trains.services.trains import slo_shortfall
from trains.services.upgrade_forecast import upgrades_forecast_check
from trains.services.upgrades import hosts_below_target
from trains.services.visits import UpgradePlan, visit_start

# After a cycle whose visits took nothing (its pending work could not be taken: a target refused as
# incompatible, a domain not among the train's stops, work longer than any visit may run; work only
# on hosts out broken opens no cycle, UpgradePlan.has_pending), the next opens no sooner than this:
# the train ticks every few seconds and would otherwise open and end an empty cycle, with its
# events, at every tick.
IDLE_AFTER_EMPTY_CYCLE = dt.timedelta(minutes=15)


def _idle_after_empty_cycle(train: Train, now: dt.datetime) -> bool:
    last = (
        Cycle.objects.filter(train=train, ended_at__gt=now - IDLE_AFTER_EMPTY_CYCLE)
        .order_by("-number")
        .values_list("id", flat=True)
        .first()
    )
    return last is not None and not VisitOperation.objects.filter(visit__cycle_id=last).exists()


def _stops_complete(train: Train) -> list[str]:
    """Invariant 6, every domain of the pool visited: the domains trains.selectors.stops_to_add names
    become the train's last stops as the next cycle opens, with an event; the names added. The
    longer cycle is judged by the budget check at the visits' start (budget_code, with the numbers)."""
    stop_ids = set(TrainStop.objects.filter(train=train).values_list("domain_id", flat=True))
    added = stops_to_add(train, stop_ids, pools_domain_hosts([train.pool_id]))
    if not added:
        return []
    missing = sorted(MaintenanceDomain.objects.filter(pk__in=added), key=lambda d: added.index(d.pk))
    last = TrainStop.objects.filter(train=train).aggregate(last=Max("position"))["last"]
    first = 0 if last is None else last + 1
    TrainStop.objects.bulk_create(
        [TrainStop(train=train, domain=domain, position=first + i) for i, domain in enumerate(missing)]
    )
    names = [domain.name for domain in missing]
    # What train_create and train_update refuse, said here: the operator added no stop, the fleet did.
    shortfall = slo_shortfall(
        stops=TrainStop.objects.filter(train=train).count(),
        concurrency=train.visit_concurrency,
        visit_estimate_s=train.visit_estimate_s,
        cycle_slo_s=train.cycle_slo_s,
    )
    event_record(
        kind="train.stops_added",
        subject=train,
        actor=ACTOR,
        pool_id=train.pool_id,
        reason=f"domains {', '.join(names)} of pool {train.pool.name} have hosts and were not among the train's "
        "stops: visited from its next cycle on",
        data={"domains": names},
    )
    if shortfall:
        event_record(
            kind="alert.cycle_slo_unkeepable",
            subject=train,
            actor=ACTOR,
            pool_id=train.pool_id,
            reason=f"train {train.name} now has {len(names)} more stops. {shortfall} "
            "Raise the SLO or visit more domains at once.",
            data={"domains": names},
        )
    return names


def _cycle_has_work(train: Train, plans: list[UpgradePlan]) -> bool:
    if train.emergency:
        # Its cycles go on until every host of its scope has the fix, and its visits take only hosts
        # in service: the next cycle opens once one still below the fix is back in service, not while
        # they are out for other work or in repair (an empty cycle, then IDLE_AFTER_EMPTY_CYCLE), nor
        # for one its target would leave incompatible (refused at every visit: out of its reach).
        return any(
            emergency_within_reach(
                train, plan.upgrade, hosts_below_target(plan.upgrade, plan.allowed).filter(state=HostState.IN_SERVICE)
            )
            for plan in plans
        )
    return any(plan.has_pending() for plan in plans)


def _cycle_open(train: Train, plans: list[UpgradePlan], now: dt.datetime) -> Cycle | None:
    cycle = Cycle.objects.filter(train=train, ended_at__isnull=True).first()
    if cycle is not None:
        return cycle
    if not _cycle_has_work(train, plans) or _idle_after_empty_cycle(train, now):
        return None  # nothing to do (or nothing it could take): the train idles rather than spin cycles
    _stops_complete(train)
    number = newest_cycle_number(train) + 1
    cycle = Cycle.objects.create(
        train=train, number=number, started_at=now, deadline_at=now + dt.timedelta(seconds=train.cycle_slo_s)
    )
    Visit.objects.bulk_create(
        [
            Visit(train=train, cycle=cycle, domain_id=stop.domain_id, position=stop.position)
            for stop in train.stops.order_by("position")
        ]
    )
    event_record(
        kind="train.cycle_started",
        subject=cycle,
        actor=ACTOR,
        pool_id=train.pool_id,
        data={"train": train.pk, "number": number, "deadline": cycle.deadline_at.isoformat()},
    )
    return cycle


def cycle_visits_start(
    *, train: Train, plans: list[UpgradePlan], now: dt.datetime, events: list[str], room: int | None = None
) -> None:
    """Start the next visits of the cycle: up to visit_concurrency at once, or, for a sliding train,
    while there is `room` for hosts (each visit releases what fits)."""
    cycle = _cycle_open(train, plans, now)
    if cycle is None:
        return
    running_plans = list(Visit.objects.filter(cycle=cycle, state=VisitState.RUNNING).values_list("plan", flat=True))
    running = len(running_plans)
    planned = list(Visit.objects.filter(cycle=cycle, state=VisitState.PLANNED).select_related("domain"))
    optouts = {}
    if planned and not train.emergency:
        optouts = optouts_by_domain(now=now, domain_ids=[v.domain_id for v in planned])
    sizing = None
    visits_left = len(planned)  # a domain skipped for now still needs its share of the time left
    for visit in planned:
        if (running >= train.visit_concurrency) if room is None else (room <= 0):
            break
        if visit.domain_id in optouts:
            _domain_skip(train, visit, optouts[visit.domain_id], now)
            continue
        if sizing is None:  # read once per tick, and only when a visit starts
            sizing = train_sizing(train, cycle=cycle.number)
            _budget_step(train, plans, sizing, now)
        left_s = (cycle.deadline_at - now).total_seconds()
        # A sliding train's hosts still out come before the visits still to start.
        in_flight_s = sliding_in_flight_s(sizing, running_plans) if room is not None else 0.0
        share = sizing_within_cycle(
            sizing, train=train, seconds_left=left_s, visits_left=visits_left, in_flight_s=in_flight_s
        )
        selection = visit_start(train=train, visit=visit, plans=plans, sizing=share, now=now, release=room)
        if selection is None:
            continue
        visits_left -= 1
        if selection.taken:
            running += 1
            running_plans.append(visit.plan)
            if room is not None:
                room -= int(visit.plan.get("released", 0))
        elif selection.left:
            why = f"nothing fits the time left in the cycle: {len(selection.left)} upgrades wait"
            visit_end(visit=visit, now=now, outcome=why)
        else:
            visit_end(visit=visit, now=now, outcome="nothing pending in this domain")
        events.append(f"visit {visit.pk} started")
    if not running and not visits_left:  # every visit done, the last ones maybe just now with nothing to do
        _cycle_end(train, cycle, now)
        events.append(f"cycle {cycle.number} done")


def _budget_step(train: Train, plans: list[UpgradePlan], sizing: VisitSizing, now: dt.datetime) -> None:
    """Say at once when an upgrade alone cannot fit a visit; promise new upgrades their forecast and
    alert on deadlines the forecast misses."""
    if not train.emergency:
        train_budget_check(train=train, upgrades=[p.upgrade for p in plans], sizing=sizing)
        upgrades_forecast_check(pool_id=train.pool_id, now=now)


def _domain_skip(train: Train, visit: Visit, reason: str, now: dt.datetime) -> None:
    """The train passes the domain for now and comes back to it later in the cycle."""
    if visit.skip_reason == reason:
        return  # one event per new reason, not one per tick
    Visit.objects.filter(pk=visit.pk).update(skips=visit.skips + 1, skip_reason=reason[:300])
    event_record(
        kind="train.domain_skipped",
        subject=visit,
        actor=ACTOR,
        reason=reason,
        pool_id=train.pool_id,
        data={"train": train.pk, "domain": visit.domain.name, "cycle": visit.cycle_id},
    )


def _cycle_end(train: Train, cycle: Cycle, now: dt.datetime) -> None:
    if not Cycle.objects.filter(pk=cycle.pk, ended_at__isnull=True).update(ended_at=now):
        return
    seconds = (now - cycle.started_at).total_seconds()
    met = now <= cycle.deadline_at
    event_record(
        kind="train.cycle_completed",
        subject=cycle,
        actor=ACTOR,
        pool_id=train.pool_id,
        reason=f"cycle {cycle.number} took {seconds:.0f} s; SLO {train.cycle_slo_s} s {'met' if met else 'missed'}",
        data={"train": train.pk, "seconds": seconds, "slo_met": met},
    )
    if train.emergency:  # it finishes once every host of its scope has the fix (emergency_train_finish_if_done)
        emergency_cycle_ended(train=train, cycle=cycle)


def visit_end(*, visit: Visit, now: dt.datetime, outcome: str, plan: dict | None = None) -> None:
    ended: dict[str, object] = {"state": VisitState.DONE, "ended_at": now, "outcome": outcome[:300]}
    if plan is not None:
        ended["plan"] = plan
    if Visit.objects.filter(pk=visit.pk, state=visit.state).update(**ended):
        event_record(
            kind="train.visit_finished",
            subject=visit,
            actor=ACTOR,
            reason=outcome,
            pool_id=visit.train.pool_id,
            data={
                "train": visit.train_id,
                "domain": visit.domain.name,
                "cycle": visit.cycle_id,
                "seconds": (now - visit.started_at).total_seconds() if visit.started_at else 0,
            },
        )

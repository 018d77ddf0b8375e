"""Per-upgrade forecast: when each active upgrade reaches every host of its scope ("by cycle N,
around <date>"), from its place in the backlog.

The coming visits are played forward on rows read once (a fixed number of queries per pool, not per
host or upgrade): the open cycle's remaining visits, then whole cycles in the train's domain order,
each visit starting when the one before it on its lane is expected to end (a running visit at its
plan's estimate, past it a while longer: `trains.selectors.running_visit_end`), and lasting at least
the train's typical recent visit if it takes anything (new upgrades keep arriving and fill it:
`_held_for`). Not every visit at the train's typical length: a meta run's first upgrade, a kernel
longer than a visit's share, was forecast at 25.7 h and was still rolling out at 10 days. The
train's own forecast lasts its open cycle's visits to come what this play gives them
(`played_durations`, stored on the cycle when their inputs change). Each
visit takes, as the train tick does (trains/services/budget.py), the pending upgrades of its domain
that fit its budget in (priority, deadline, age) order, the newest release of a component standing
in for the older ones it supersedes, a multi-cycle one's places on hosts where it fits
(selectors_forecast_takes.py). A visit misses some hosts (a failed drain or execution, work deferred to the next
cycle): as many as the train's recent visits missed are taken again at their domains' next visits
(`hosts_missed`). Approximations: rollout phases are assumed to graduate on time unless held (an
upgrade whose phase in force is held is `phase_held`: selectors_forecast_verdict.py), hosts of
different upgrades in one domain overlap (numbered from 0 for each), and the missed hosts are spread
evenly over the domains the upgrade had hosts pending in.

A visit takes hosts in service. One escalated to a human is not played (`hosts_escalated`). One out
broken (failed, its repair queued, or in repair) is taken at its domain's first visit after its repair
returns it: played from the cycle after the first one played, whose visits start while it may still
be out (`PoolBacklog.broken`; a cycle late when the repair ends before its domain's visit there).
Hosts where every visit refuses the upgrade as incompatible are not played (selectors_incompatible.py).
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import NamedTuple

from opsplanner import clock
from opsplanner.prepared import IDS, PreparedModels
from trains.models import (
    LIVE_TRAIN_STATES,
    STOPPED_TRAIN_STATES,
    Pace,
    Train,
    Upgrade,
    UpgradeState,
    Visit,
    VisitState,
)
from trains.selectors import TrainForecast, pools_domain_hosts, running_visit_end, stops_to_add
from trains.selectors_forecast_sliding import HostsOut, SlidingFlow, sliding_flow_open
from trains.selectors_forecast_takes import ranked_takes
from trains.selectors_forecast_verdict import (
    MAX_CYCLES,
    HeldPhase,
    UpgradeForecast,
    held_phase,
    held_phase_annotations,
    upgrade_forecast_of,
)
from trains.selectors_forecast_verdict import ForecastCode as ForecastCode  # where every caller imports it from
from trains.selectors_incompatible import (
    RULE_MAY_REFUSE,
    Incompatible,
    refused_out,
    rule_may_refuse,
    upgrades_refused,
)
from trains.selectors_missed import hosts_missed, trains_missed_share
from trains.selectors_pending import pending_by_domain
from trains.selectors_running_visits import RunningVisit, joins_expected, running_visits_takes
from trains.services.budget import VisitSizing, sizing_for, sizing_within_cycle

# What forecasting a list of upgrades costs, however many (pinned by the tests): the pools' trains,
# their active upgrades, the trains' forecasts (4: not when each domain was last visited), the
# domains' sizes, the installed versions per domain, what the recent visits missed and, while a
# visit runs, its tasks not installed yet. An upgrade whose scope is narrower than its pool adds two;
# upgrades whose target a compatibility rule could refuse add five at most, together
# (selectors_incompatible.py).
FORECAST_QUERIES = 10


@dataclass
class PoolBacklog:
    """What a pool's forecast is played on: its train, the train's forecast and open-cycle visits,
    the sizing of its visits, and per active upgrade the hosts still pending per domain."""

    train: Train
    forecast: TrainForecast
    visits: dict[int, Visit]
    sizing: VisitSizing
    upgrades: list[Upgrade]
    pending: dict[int, dict[int, int]]  # upgrade -> domain -> hosts below target a visit can take
    cycle_number: int
    missed_share: float = 0.0  # of the hosts its recent visits took, the share they missed (trains_missed_share)
    # Domains the train's next cycle adds as its last stops (trains.selectors.stops_to_add: racks
    # onboarded since the train was made); played from the next cycle on, as the tick visits them.
    added_stops: list[int] = field(default_factory=list)
    # upgrade -> hosts below target escalated to a human: no visit takes them (a visit takes hosts in
    # service) until a human returns them, so they are not played and the forecast names them.
    escalated: dict[int, int] = field(default_factory=dict)
    # What each running visit has yet to do (running_visits_takes, then _joins_expected).
    running: dict[int, RunningVisit] = field(default_factory=dict)
    # upgrade -> domain -> hosts below target out broken (failed, in repair): played from the cycle
    # after the first the forecast plays, the visits of which start while they may still be out.
    broken: dict[int, dict[int, int]] = field(default_factory=dict)
    # upgrade -> its hosts the visits refuse it on as incompatible: not in `pending` nor `broken`.
    incompatible: dict[int, Incompatible] = field(default_factory=dict)
    # upgrade -> its phase in force, held short of evidence: still played (selectors_forecast_verdict.py).
    held: dict[int, HeldPhase] = field(default_factory=dict)

    @property
    def stopped(self) -> bool:
        """A paused or autostopped train visits nothing until it runs again: its upgrades are not
        forecast (played as if it ran, they were promised a time it may never keep)."""
        return self.train.state in STOPPED_TRAIN_STATES

    def pending_and_broken(self, upgrade_id: int) -> dict[int, int]:
        """The upgrade's hosts below its target per domain that visits take, now or once repaired."""
        both = dict(self.pending.get(upgrade_id, {}))
        for domain_id, hosts in self.broken.get(upgrade_id, {}).items():
            both[domain_id] = both.get(domain_id, 0) + hosts
        return both

    @property
    def next_cycles_stops(self) -> list[int]:
        """The domains every cycle after the open one visits, in order."""
        return [d.domain_id for d in sorted(self.forecast.domains, key=lambda d: d.position)] + self.added_stops


@dataclass
class _Visit:
    domain_id: int
    cycle: int
    starts_at: dt.datetime
    # Where the visit stands in its cycle: its budget (its share, or less in a cycle behind its
    # deadline) and how long an upgrade too long for it may take there (budget.sizing_within_cycle),
    # as the train tick decides them.
    deadline: dt.datetime
    visits_left: int
    in_flight_s: float = 0.0  # a sliding train's hosts still out come first (budget.sliding_in_flight_s)


class _Played(NamedTuple):
    """What a played visit sends back: how long it holds its hosts, and how many it took."""

    cost_s: float
    hosts: int


@dataclass
class _State:
    remaining: dict[int, dict[int, int]]
    done: dict[int, tuple[int, dt.datetime]] = field(default_factory=dict)
    # Per upgrade, (cycle, end) of the latest-ending visit that took any of its hosts: on several
    # lanes the visit that takes its last hosts need not be the last of its visits to end.
    last_end: dict[int, tuple[int, dt.datetime]] = field(default_factory=dict)
    # What taking the missed hosts again needs: the hosts pending per domain when the play started,
    # the train's domain order, the share its visits miss, and the upgrades whose misses were added.
    first: dict[int, dict[int, int]] = field(default_factory=dict)
    stops: list[int] = field(default_factory=list)
    missed_share: float = 0.0
    again: set[int] = field(default_factory=set)
    # The hosts out broken per upgrade and domain, added to `remaining` as cycle `returns_in` starts.
    broken: dict[int, dict[int, int]] = field(default_factory=dict)
    returns_in: int = 0
    # The open cycle's played visits, domain -> seconds (`played_durations`).
    durations: dict[int, float] = field(default_factory=dict)


def pool_backlogs(pool_ids: list[int], *, now: dt.datetime) -> tuple[dict[int, PoolBacklog], list[Upgrade]]:
    """Per pool with a live regular train, its backlog; and every active upgrade of the pools."""
    from trains.selectors_web import trains_forecasts_with_visits

    trains = list(
        Train.objects.filter(pool_id__in=pool_ids, emergency=False, state__in=LIVE_TRAIN_STATES).select_related("pool")
    )
    upgrades = active_upgrades(pool_ids)
    if not trains:
        return {}, upgrades
    read = trains_forecasts_with_visits(trains, now=now, last_visits=False)  # only what is to come
    return backlogs_of(trains, upgrades, read, now=now), upgrades


# Every per-upgrade forecast reads them, and the train tick's played cycle (services/cycle_played.py): compiled once.
_ACTIVE_UPGRADES = PreparedModels(
    lambda *, ids: (
        Upgrade.objects.filter(pool_id__any=ids, emergency=False, state=UpgradeState.ACTIVE)
        .select_related("pool", "component_version__component")
        .annotate(**{RULE_MAY_REFUSE: rule_may_refuse()}, **held_phase_annotations())
        .order_by("created_at", "id")
    ),
    ids=IDS,
)


def active_upgrades(pool_ids: list[int]) -> list[Upgrade]:
    """The active regular upgrades of the pools, oldest first, as the forecast plays them (one query)."""
    return _ACTIVE_UPGRADES.objects(ids=pool_ids)


def backlogs_of(
    trains: list[Train],
    upgrades: list[Upgrade],
    read: tuple[dict[int, TrainForecast], dict[int, dict[int, Visit]]],
    *,
    now: dt.datetime,
) -> dict[int, PoolBacklog]:
    """The backlog of each of these live regular trains' pools (their pools with them), from their
    pools' active upgrades and the trains' forecasts and open-cycle visits (`read`)."""
    forecasts, visits = read
    domains = pools_domain_hosts([t.pool_id for t in trains])
    below = pending_by_domain(upgrades, domains)
    missed = trains_missed_share([t.pk for t in trains], now=now)
    running = running_visits_takes([t.pk for t in trains], [v for vs in visits.values() for v in vs.values()])
    refused = upgrades_refused(upgrades)
    backlogs = {}
    for train in trains:
        ours = [u for u in upgrades if u.pool_id == train.pool_id]
        pending, broken, incompatible = {}, {}, {}
        for u in ours:
            pending[u.pk], broken[u.pk], left_out = refused_out(
                refused.get(u.pk), below.played.get(u.pk, {}), below.broken.get(u.pk, {})
            )
            if left_out is not None:
                incompatible[u.pk] = left_out
        forecast = forecasts[train.pk]
        domain_ids = [d.domain_id for d in forecast.domains]
        largest = max((below.sizes.get(d, 0) for d in domain_ids), default=0)
        sizing = sizing_for(
            train,
            domains=len(domain_ids),
            largest_domain=largest,
            planned_buffer=train.pool.buffers_for(below.pool_sizes.get(train.pool_id, 0)).planned,
            correction=forecast.correction,
        )
        backlogs[train.pool_id] = PoolBacklog(
            train=train,
            forecast=forecast,
            visits=visits.get(train.pk, {}),
            sizing=sizing,
            upgrades=ours,
            pending=pending,
            cycle_number=forecast.last_cycle_number,
            missed_share=missed.get(train.pk, 0.0),
            added_stops=stops_to_add(train, set(domain_ids), domains),
            escalated={u.pk: n for u in ours if (n := below.escalated.get(u.pk))},
            running={v.pk: running[v.pk] for v in visits.get(train.pk, {}).values() if v.pk in running},
            broken={u: hosts for u, hosts in broken.items() if hosts},
            incompatible=incompatible,
            held={u.pk: held for u in ours if (held := held_phase(u))},
        )
        _joins_expected(backlogs[train.pool_id])
    return backlogs


def _joins_expected(backlog: PoolBacklog) -> None:
    """The late joiners the running visits of the backlog's train can expect (joins_expected)."""
    visits = [backlog.visits[d.domain_id] for d in backlog.forecast.domains if d.domain_id in backlog.visits]
    running = [v for v in visits if v.pk in backlog.running]
    joins_expected(running, backlog.running, upgrades=backlog.upgrades, pending=backlog.pending, sizing=backlog.sizing)


# --- playing the visits forward ---------------------------------------------------------------------
def _coming_visits(backlog: PoolBacklog, now: dt.datetime, state: _State) -> Generator[_Visit, _Played | None, None]:
    """The open cycle's remaining visits, then whole cycles in the train's domain order, on the
    train's lanes (visit_concurrency): each visit starts when a lane is free and lasts what its work
    is forecast to take (the cost sent back), so a backlog that makes visits long moves the ones
    after it, and a cycle that falls behind gives its last visits less, as the tick does. A running
    visit holds its lane until its plan's estimate (its hosts are counted as reached then). A sliding
    train has no lanes: it plays its visits as its release rule starts them (`SlidingFlow`)."""
    forecast, number = backlog.forecast, backlog.cycle_number
    lanes_n = backlog.train.visit_concurrency
    sliding = backlog.train.pace == Pace.SLIDING
    start = now
    if forecast.cycle is not None:
        running: list[tuple[dt.datetime, dt.datetime]] = []  # (started, expected end)
        planned = []
        for domain in forecast.domains:
            visit = backlog.visits.get(domain.domain_id)
            if visit is not None and visit.state == VisitState.RUNNING:
                its = backlog.running.get(visit.pk, RunningVisit({}, 0))
                ends = running_visit_end(visit, backlog.forecast.visit_seconds, now) + dt.timedelta(seconds=its.extra_s)
                for upgrade_id, hosts in its.takes.items():
                    left = state.remaining.get(upgrade_id, {})
                    if left.get(domain.domain_id):
                        left[domain.domain_id] = max(0, left[domain.domain_id] - hosts)
                        _note_took(state, upgrade_id, number, ends)
                _note_done(state, number, ends)
                running.append((visit.started_at or now, ends))
            elif visit is not None and visit.state == VisitState.PLANNED and domain.starts_at is not None:
                planned.append(domain.domain_id)
        if sliding:
            flow = sliding_flow_open(backlog.sizing, backlog.train, now, _running_visits_out(backlog, now))
            last = yield from _sliding_cycle_visits(planned, number, flow, forecast.cycle.deadline_at)
            start = max([now, last, *(ends for _, ends in running)])
        else:
            # As the train forecast does: the visits that started first hold the lanes.
            lanes = [ends for _, ends in sorted(running)[:lanes_n]] + [now] * max(0, lanes_n - len(running))
            yield from _cycle_visits(planned, number, lanes, forecast.cycle.deadline_at)
            start = max([now, *lanes, *(ends for _, ends in running)])
    stops = backlog.next_cycles_stops
    slo = dt.timedelta(seconds=backlog.train.cycle_slo_s)
    # Work only on hosts out broken opens no cycle (visits.UpgradePlan.has_pending): the next opens as they return.
    idle = forecast.cycle is None and not any(sum(left.values()) for left in state.remaining.values())
    state.returns_in = number + 1 if forecast.cycle is not None or idle else number + 2
    for cycle in range(number + 1, number + 1 + MAX_CYCLES):
        if cycle == state.returns_in:
            _broken_back(state)
        if sliding:
            flow = sliding_flow_open(backlog.sizing, backlog.train, start, [])
            start = yield from _sliding_cycle_visits(stops, cycle, flow, start + slo)
        else:
            lanes = [start] * lanes_n
            yield from _cycle_visits(stops, cycle, lanes, start + slo)
            start = max(lanes)
        if all(sum(left.values()) == 0 for left in state.remaining.values()) and not state.broken:
            return


def _cycle_visits(
    domain_ids: list[int], cycle: int, lanes: list[dt.datetime], deadline: dt.datetime
) -> Generator[_Visit, _Played | None, None]:
    """One cycle's visits in order on `lanes` (their free times, updated in place)."""
    for position, domain_id in enumerate(domain_ids):
        lane = min(range(len(lanes)), key=lambda i: lanes[i])
        played = yield _Visit(domain_id, cycle, lanes[lane], deadline, len(domain_ids) - position)
        lanes[lane] += dt.timedelta(seconds=played.cost_s if played else 0)


def _sliding_cycle_visits(
    domain_ids: list[int], cycle: int, flow: SlidingFlow, deadline: dt.datetime
) -> Generator[_Visit, _Played | None, dt.datetime]:
    """One cycle's visits of a sliding train in order, each starting when its release rule would
    (`flow`), sized with the hosts still out first; when the last of their hosts is back."""
    last = flow.next_at
    for position, domain_id in enumerate(domain_ids):
        starts = flow.next_at
        played = yield _Visit(domain_id, cycle, starts, deadline, len(domain_ids) - position, flow.in_flight_s())
        last = max(last, flow.played(starts, played.cost_s, played.hosts) if played else starts)
    return last


def _running_visits_out(backlog: PoolBacklog, now: dt.datetime) -> list[HostsOut]:
    """A sliding train's running visits as hosts out: each its plan's per-wave estimate until its
    expected end, its hosts not yet released holding the next domain back until its last wave."""
    out = []
    for domain in backlog.forecast.domains:
        visit = backlog.visits.get(domain.domain_id)
        if visit is None or visit.state != VisitState.RUNNING:
            continue
        plan = visit.plan or {}
        hosts = len(plan.get("hosts") or [])
        extra = backlog.running.get(visit.pk, RunningVisit({}, 0)).extra_s
        ends = running_visit_end(visit, backlog.forecast.visit_seconds, now) + dt.timedelta(seconds=extra)
        waves = backlog.sizing.waves(hosts)
        per_wave = float(plan.get("estimate_s") or 0) / waves if waves else 0.0
        out.append(HostsOut(ends, min(hosts, backlog.sizing.hosts_at_once), per_wave, bool(plan.get("unreleased"))))
    return out


def _note_took(state: _State, upgrade_id: int, cycle: int, ends: dt.datetime) -> None:
    """A visit ending at `ends` took some of the upgrade's hosts."""
    if upgrade_id not in state.last_end or ends > state.last_end[upgrade_id][1]:
        state.last_end[upgrade_id] = (cycle, ends)


def _broken_back(state: _State) -> None:
    """The hosts out broken are back for the cycle starting: pending at their domains' visits."""
    for upgrade_id, domains in state.broken.items():
        left = state.remaining.setdefault(upgrade_id, {})
        for domain_id, hosts in domains.items():
            left[domain_id] = left.get(domain_id, 0) + hosts
    state.broken = {}


def _note_done(state: _State, cycle: int, at: dt.datetime) -> None:
    """Each upgrade left with no host pending (none out broken either) is done when the last of the
    visits that took its hosts ends (`at`, the visit just played, if none took any)."""
    for upgrade_id, left in state.remaining.items():
        if upgrade_id in state.done or sum(left.values()) > 0 or state.broken.get(upgrade_id):
            continue
        again = _taken_again(state, upgrade_id)
        if again:
            state.remaining[upgrade_id] = again
        else:
            state.done[upgrade_id] = state.last_end.get(upgrade_id, (cycle, at))


def _taken_again(state: _State, upgrade_id: int) -> dict[int, int]:
    """Once an upgrade's pending hosts were all visited: the hosts its visits are expected to have
    missed, per domain, which their domains' next visits take again (once; none if none expected).
    Spread evenly over the domains it had hosts pending in, so the last of n missed hosts lies about
    n / (n + 1) of the way through the next pass, where the last of n scattered at random would."""
    if upgrade_id in state.again:
        return {}
    state.again.add(upgrade_id)
    first = state.first.get(upgrade_id, {})
    domains = [d for d in state.stops if first.get(d)]
    missed = hosts_missed(state.missed_share, sum(first.values()))
    again: dict[int, int] = defaultdict(int)
    for i in range(1, missed + 1):
        domain = domains[min(len(domains) - 1, math.ceil(i * len(domains) / (missed + 1)) - 1)]
        if again[domain] < first[domain]:
            again[domain] += 1
    return dict(again)


class VisitTaken(NamedTuple):
    """What a played visit takes: its expected length, the upgrades it reached, how many hosts."""

    cost_s: float
    reached: set[int]
    hosts: int


def _visit_takes(backlog: PoolBacklog, state: _State, upgrades: list[Upgrade], visit: _Visit) -> VisitTaken:
    """Apply what the visit would take to the state; what it takes (VisitTaken)."""
    domain_id, left_s = visit.domain_id, (visit.deadline - visit.starts_at).total_seconds()
    sizing = sizing_within_cycle(
        backlog.sizing,
        train=backlog.train,
        seconds_left=left_s,
        visits_left=visit.visits_left,
        in_flight_s=visit.in_flight_s,
    )
    waiting = [u for u in upgrades if state.remaining[u.pk].get(domain_id)]
    counts = {u.pk: state.remaining[u.pk][domain_id] for u in waiting}
    by_component: dict[int, list[Upgrade]] = defaultdict(list)
    for upgrade in waiting:
        by_component[upgrade.component_version.component_id].append(upgrade)
    selection = ranked_takes(list(by_component.values()), counts, sizing)
    reached_any: set[int] = set()
    for upgrade, its_hosts in selection.taken:  # its own hosts, and those of each older release it has
        version = upgrade.component_version
        for other in by_component[version.component_id]:
            older = other.pk != upgrade.pk
            if older and other.component_version.sort_key >= version.sort_key:
                continue  # a newer release: not reached by this one
            has = counts[other.pk]  # an older release's pending hosts are the first numbers: those below
            reached = sum(h < has for h in its_hosts) if older and max(its_hosts) >= has else len(its_hosts)
            state.remaining[other.pk][domain_id] = max(0, state.remaining[other.pk][domain_id] - reached)
            if reached:
                reached_any.add(other.pk)
    hosts = len(frozenset[int]().union(*(take.hosts for take in selection.taken)))
    return VisitTaken(selection.cost_s, reached_any, hosts)


def play_forward(
    backlog: PoolBacklog,
    *,
    now: dt.datetime,
    priorities: dict[int, int] | None = None,
    whole_visits: frozenset[int] = frozenset(),
) -> dict[int, tuple[int, dt.datetime]]:
    """Per upgrade, (cycle, time) when its last pending host is reached; missing: beyond the horizon.
    What-if (would it meet a deadline?): `priorities` overrides some upgrades' priority, and the
    multi-cycle upgrades in `whole_visits` are played as taking every host of a visit."""
    return _played(backlog, now=now, priorities=priorities, whole_visits=whole_visits).done


def played_durations(backlog: PoolBacklog, *, now: dt.datetime) -> dict[int, float]:
    """Per domain, the seconds the open cycle's visit to come lasts as play_forward plays it (what
    its work costs, at least the train's typical visit; a visit with nothing to take, 0: the tick
    skips it). Played no further than that cycle. None open: nothing."""
    if backlog.forecast.cycle is None:
        return {}
    return _played(backlog, now=now, open_cycle=backlog.cycle_number).durations


def _played(
    backlog: PoolBacklog,
    *,
    now: dt.datetime,
    priorities: dict[int, int] | None = None,
    whole_visits: frozenset[int] = frozenset(),
    open_cycle: int = 0,
) -> _State:
    """The visits played forward (play_forward); with `open_cycle`, only up to its end, noting
    how long each of its visits lasts."""
    upgrades = [_as_if(u, (priorities or {}).get(u.pk), whole=u.pk in whole_visits) for u in backlog.upgrades]
    state = _State(
        remaining={u.pk: dict(backlog.pending.get(u.pk, {})) for u in upgrades},
        first={u.pk: backlog.pending_and_broken(u.pk) for u in upgrades},
        stops=backlog.next_cycles_stops,
        missed_share=backlog.missed_share,
        broken={u.pk: dict(out) for u in upgrades if (out := backlog.broken.get(u.pk))},
    )
    _note_done(state, backlog.cycle_number or 1, now)
    visits = _coming_visits(backlog, now, state)
    played = None
    try:
        while True:
            visit = visits.send(played)
            if open_cycle and visit.cycle > open_cycle:
                break
            work_s, reached, hosts = _visit_takes(backlog, state, upgrades, visit)
            played = _Played(_held_for(backlog, work_s), hosts)
            ends = visit.starts_at + dt.timedelta(seconds=played.cost_s)
            for upgrade_id in reached:
                _note_took(state, upgrade_id, visit.cycle, ends)
            _note_done(state, visit.cycle, ends)
            if visit.cycle == open_cycle:
                state.durations[visit.domain_id] = played.cost_s
    except StopIteration:
        pass
    return state


def _held_for(backlog: PoolBacklog, cost: float) -> float:
    """How long a played visit that takes work holds its lane: what that work costs, and at least the
    train's typical recent visit (`TrainForecast.visit_seconds`). Upgrades keep arriving at about
    the rate that filled the recent visits, and join the visits behind the known ones: played with
    the known work alone, the visits that reach a new upgrade (the last of the backlog) were short:
    at the sliding pace in the meta regime, cycles played as short as 47 h where the train ran 68-71
    h, and upgrades finished a median 44 h after their promise (6 of 20 kept). A visit with nothing
    to take is skipped, as the tick skips it."""
    return max(cost, backlog.forecast.visit_seconds) if cost > 0 else 0.0


def _as_if(upgrade: Upgrade, priority: int | None, *, whole: bool) -> Upgrade:
    """The upgrade, or an unsaved copy with another priority or taking every host of a visit."""
    if priority is None and not whole:
        return upgrade
    copy = Upgrade(**{f.attname: getattr(upgrade, f.attname) for f in Upgrade._meta.concrete_fields})
    copy.priority = upgrade.priority if priority is None else priority
    if whole:
        copy.multi_cycle, copy.hosts_per_visit = False, None
    copy.component_version = upgrade.component_version
    return copy


def upgrades_forecasts(upgrades: list[Upgrade], *, now: dt.datetime | None = None) -> dict[int, UpgradeForecast]:
    """The forecast of each upgrade (a fixed number of queries per pool of the list)."""
    now = now or clock.now()
    pool_ids = sorted({u.pool_id for u in upgrades if u.state == UpgradeState.ACTIVE})
    backlogs, _ = pool_backlogs(pool_ids, now=now) if pool_ids else ({}, [])
    done = {pool_id: play_forward(backlog, now=now) for pool_id, backlog in backlogs.items() if not backlog.stopped}
    return {u.pk: upgrade_forecast_of(u, backlogs.get(u.pool_id), done.get(u.pool_id, {})) for u in upgrades}

"""Visits sized to the promise: each visit of a train has a time budget (its share of the cycle SLO),
and takes the pending upgrades that fit in it, by priority, then deadline, then age; the rest waits
for the next cycle (still one drain per host per cycle).

The cost model of one visit: hosts of a domain work in parallel, as many at once as the visit's
share of the planned buffer allows (waves), and each host applies its upgrades one after another in
one drain (handover). So a visit costs waves x (overhead + the sum of the upgrades' work), corrected
by how long the train's recent visits really took against that cost. A visit lasts as long as its
slowest host, so the correction is a high quantile of the recent ratios, not their mean: sized on
the mean, half the visits ran over and the cycle missed its SLO.

Each visit's budget is its share of the SLO, and never more than the time left before the cycle's
deadline shared among the visits still to start (`sizing_within_cycle`): a visit that ran long, or a
domain skipped for an opt-out window, is made up by the visits after it, not by the deadline.
"""

from __future__ import annotations

import datetime as dt
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple, TypeVar

from django.db.models import Count, F, Max, Min, Sum, Window
from django.db.models.functions import RowNumber

from fleet.models import Host
from fleet.selectors.capacity import pool_capacity
from opsplanner.events import event_record
from opsplanner.models import HostTask
from opsplanner.prepared import IDS, PreparedQuery
from trains.models import BudgetCode, Cycle, Pace, Train, TrainStop, Upgrade, Visit, VisitState
from trains.services.actor import ACTOR

MEASURED_VISITS = 10  # recent visits that correct the estimates
# ... taken from the train's last few cycles only. A train can size itself to a standstill: a few
# visits that ran very long (a host stuck draining) make every estimate exceed its budget, visits
# take nothing, nothing new is measured, and the correction would never come back down. Its empty
# cycles pass quickly, so after them it falls back to its estimates. (A count of cycles, not of
# hours: an idle train starts no cycle and keeps what it measured.)
MEASURED_CYCLES = 3
MIN_MEASURED = 3  # fewer than this and the estimates stand as they are
MEASURED_QUANTILE = 0.9  # the correction covers this share of the recent visits, not just the average one
FACTOR_BOUNDS = (0.25, 10.0)  # one odd visit cannot make the budget absurd

T = TypeVar("T")


def upgrade_order_key(upgrade: Upgrade) -> tuple[int, float, float, int]:
    """The order a visit takes upgrades in: priority (higher first), then deadline (sooner first,
    none last), then age."""
    deadline = upgrade.deadline.timestamp() if upgrade.deadline else math.inf
    return (-upgrade.priority, deadline, upgrade.created_at.timestamp(), upgrade.pk)


def train_overhead_s(train: Train) -> int:
    """Drain, checks and return of one visit: as set, else half the train's visit estimate."""
    return train.visit_overhead_s if train.visit_overhead_s is not None else max(1, train.visit_estimate_s // 2)


def train_default_work_s(train: Train) -> int:
    """An upgrade without a duration of its own: what is left of the train's visit estimate after the
    overhead (a visit of one such upgrade takes the estimate), at least a second."""
    return max(1, train.visit_estimate_s - train_overhead_s(train))


@dataclass(frozen=True)
class VisitSizing:
    """What sizes a train's visits: the budget, the overhead, the hosts one visit may have out at
    once, and the measured correction of the estimates."""

    budget_s: float
    overhead_s: int
    hosts_at_once: int
    factor: float
    domains: int
    largest_domain: int
    default_work_s: int = 1
    # A sliding train's tail: how much longer than its corrected estimate its slowest host takes
    # (measured like the factor, from each visit's slowest host; at least 1). The cycle ends when
    # the last hosts are back, so the time the last of them take counts at this rate.
    tail: float = 1.0
    # A domain-paced visit's wave takes at least its uncorrected cost plus this (`Correction.extra_s`;
    # None: not measured, the factor alone).
    extra_s: float | None = None
    # How long a visit may run when its first upgrade alone does not fit the budget: what the cycle
    # can give up if every visit after this one shrinks to its overhead. None: no limit, the first
    # upgrade is always taken (an emergency train, a cycle already past its deadline).
    stretch_s: float | None = None
    # A domain-paced visit's hosts all wait for its busiest one: once its first upgrade has made it
    # longer than its budget, work that does not make it longer still fits. A sliding visit's hosts
    # return as each finishes and make room for the next domain's, so there the budget stays the
    # limit of each host's own work (taking up to the long upgrade's length beside it finished fewer
    # rollouts in a 20-day meta run), and a host over it keeps no other host from its work.
    waits_for_busiest: bool = True

    def work_s(self, upgrade: Upgrade) -> int:
        """The time one host takes to apply the upgrade (before the measured correction)."""
        return upgrade.duration_s or self.default_work_s

    def waves(self, hosts: int) -> int:
        return max(1, math.ceil(hosts / self.hosts_at_once)) if hosts else 0

    def cost_s(self, hosts: int, works: Sequence[float]) -> float:
        """The expected length of a visit over `hosts` hosts applying `works` one after another: per
        wave, its uncorrected cost times the factor or plus the extra, whichever is longer."""
        if not hosts or not works:
            return 0.0
        per_wave = self.overhead_s + sum(works)
        corrected = per_wave * self.factor
        if self.extra_s is not None:
            corrected = max(corrected, per_wave + self.extra_s)
        return self.waves(hosts) * corrected

    def uncorrected_s(self, hosts: int, estimate_s: float) -> float:
        """The cost before the correction of a visit over `hosts` hosts that `cost_s` estimated at
        `estimate_s` (its inverse: what the next visits are measured against)."""
        waves = self.waves(hosts)
        if not waves:
            return 0.0
        per_wave = estimate_s / waves
        uncorrected = per_wave / self.factor
        if self.extra_s is not None:
            uncorrected = min(uncorrected, per_wave - self.extra_s)
        return waves * uncorrected


def train_sizing(train: Train, *, cycle: int | None = None) -> VisitSizing:
    """The sizing of the train's visits, `cycle` its newest cycle's number (four queries, five
    without `cycle`)."""
    domain_ids = list(TrainStop.objects.filter(train=train).values_list("domain_id", flat=True))
    return sizing_for(
        train,
        domains=len(domain_ids),
        largest_domain=_largest_domain(domain_ids),
        planned_buffer=pool_capacity(train.pool).buffers.planned,
        correction=measured_correction(train, cycle=cycle),
    )


class Correction(NamedTuple):
    """The measured correction of a train's estimates (`measured_correction`)."""

    factor: float = 1.0
    tail: float = 1.0  # a sliding train's slowest hosts against the factor (VisitSizing.tail)
    # A domain-paced train's visits: what a wave took beyond its uncorrected cost (VisitSizing.extra_s).
    # A visit waits for its slowest host, whose slow drain is a fixed extra, not a share of the work:
    # sized with the ratio alone, a small visit (a cycle's last, behind its deadline) overran its
    # estimate by a larger ratio than the larger visits that set it, and the cycle missed its SLO by
    # minutes (6 of 98 cycles at 10,000 meta hosts). None: not measured.
    extra_s: float | None = None


class MeasuredVisit(NamedTuple):
    """A train's recent done visit as the correction reads it (the plan's keys: `MEASURED_FIELDS`)."""

    pk: int
    cycle: int  # its cycle's number
    started_at: dt.datetime
    ended_at: dt.datetime
    cost_s: float | None  # the plan's uncorrected cost
    released: int | None  # a sliding visit's hosts released at its start (None: domain-paced)
    host_time: object  # what a sliding visit kept under HOST_TIME_KEY
    waves: int | None  # the plan's waves (None: one, a visit planned before they were kept)


HOST_TIME_KEY = "host_time"  # a sliding visit's plan keeps its HostTimeRatios as it ends
# What a correction reads of a visit (MeasuredVisit), as values_list arguments.
MEASURED_FIELDS = (
    "pk", "cycle__number", "started_at", "ended_at",
    "plan__cost_s", "plan__released", "plan__" + HOST_TIME_KEY, "plan__waves",
)  # fmt: skip


def visit_rounds(visits: int, lanes: int) -> int:
    """How many visits one after another a cycle of `visits` takes with `lanes` (visit_concurrency)
    running at once: the one count behind a visit's share of the SLO and the SLO's lower bound. A
    share of SLO x lanes / visits overran the cycle when the visits do not divide among the lanes
    (3 domains, 2 at once: 2 visits in a row, not 1.5)."""
    return max(1, math.ceil(visits / max(1, lanes)))


def sizing_for(
    train: Train, *, domains: int, largest_domain: int, planned_buffer: int, correction: Correction
) -> VisitSizing:
    """The sizing from what was read: each visit's share of the SLO, and of the planned buffer (an
    emergency train may take whole domains whatever the buffer, down to the hard floor)."""
    at_once = largest_domain if train.emergency else planned_buffer // train.visit_concurrency
    return VisitSizing(
        budget_s=train.cycle_slo_s / visit_rounds(max(1, domains), train.visit_concurrency),
        overhead_s=train_overhead_s(train),
        hosts_at_once=max(1, at_once),
        factor=correction.factor,
        domains=max(1, domains),
        largest_domain=largest_domain,
        default_work_s=train_default_work_s(train),
        tail=correction.tail,
        extra_s=correction.extra_s,
        waits_for_busiest=train.pace != Pace.SLIDING,
    )


def _largest_domain(domain_ids: list[int]) -> int:
    counts = Host.objects.filter(domain_id__in=domain_ids).values("domain_id").annotate(n=Count("id"))
    return max((row["n"] for row in counts), default=0)


# A done visit that took work, newest first, at most MEASURED_VISITS per train; compiled once (the
# train tick sizes a visit with it, the pages and the tick's forecast read it for many trains).
_RECENT_MEASURED = PreparedQuery(
    lambda *, ids: (
        Visit.objects.filter(
            train_id__any=ids,
            state=VisitState.DONE,
            started_at__isnull=False,
            ended_at__isnull=False,
            plan__cost_s__gt=0,
        )
        # Visits end on the same instant (the scheduler's grid): the id breaks the tie, or which of
        # them counted, and so the correction and the forecasts, changed with the rows' order on disk.
        .annotate(rank=Window(RowNumber(), partition_by=F("train_id"), order_by=[F("ended_at").desc(), F("id").desc()]))
        .filter(rank__lte=MEASURED_VISITS)
        .order_by("train_id", "rank")
        .values_list("train_id", *MEASURED_FIELDS)
    ),
    ids=IDS,
)


def recent_visits(newest_cycles: dict[int, int]) -> dict[int, list[MeasuredVisit]]:
    """Per train given as {train: its newest cycle's number}, its recent visits that took work,
    newest first: at most MEASURED_VISITS, of its last MEASURED_CYCLES cycles (one query)."""
    out: dict[int, list[MeasuredVisit]] = defaultdict(list)
    if not newest_cycles:
        return out
    for train_id, *row in _RECENT_MEASURED.rows(ids=newest_cycles.keys()):
        visit = MeasuredVisit(*row)
        if visit.cycle > newest_cycles[train_id] - MEASURED_CYCLES:
            out[train_id].append(visit)
    return out


def newest_cycle_number(train: Train) -> int:
    return Cycle.objects.filter(train=train).aggregate(n=Max("number"))["n"] or 0


def measured_correction(train: Train, *, cycle: int | None = None) -> Correction:
    """How long the train's recent visits took against their uncorrected cost (the plan's cost_s),
    `cycle` its newest cycle's number (None: read it); 1 until enough visits were measured (one query,
    one more without `cycle`, one more with sliding visits that kept no host time)."""
    recent = recent_visits({train.pk: newest_cycle_number(train) if cycle is None else cycle})[train.pk]
    overhead = train_overhead_s(train)
    return correction_from(
        recent, visits_host_time({v.pk: (overhead, v.host_time) for v in recent if v.released is not None})
    )


def correction_from(visits: Sequence[MeasuredVisit], by_hosts: dict[int, HostTimeRatios]) -> Correction:
    """The correction from a train's recent visits, with its sliding visits' host time ratios (no
    query). A domain-paced visit counts by its span, as a ratio to its uncorrected cost and as the
    time a wave took beyond it. A sliding visit (its plan counts the hosts it "released") overlaps
    its neighbours, so its span says little: it counts by its hosts (visits_host_time), and its
    slowest host gives the tail."""
    ratios, extras = [], []
    for visit in visits:
        if visit.released is None:
            if not visit.cost_s or visit.cost_s <= 0:
                continue
            took, cost = (visit.ended_at - visit.started_at).total_seconds(), float(visit.cost_s)
            ratios.append(took / cost)
            # Bounded as the ratio is (FACTOR_BOUNDS): one odd visit cannot make the budget absurd.
            extras.append(min(took - cost, (FACTOR_BOUNDS[1] - 1) * cost) / max(1, visit.waves or 1))
        elif visit.pk in by_hosts:
            ratios.append(by_hosts[visit.pk].total)
    factor = factor_from(ratios)
    slowest = [by_hosts[v.pk].slowest for v in visits if v.released is not None and v.pk in by_hosts]
    tail = factor_from(slowest) / factor if len(slowest) >= MIN_MEASURED else 1.0
    extra = _quantile(extras) if len(extras) >= MIN_MEASURED else None
    return Correction(factor=factor, tail=max(1.0, tail), extra_s=extra)


class HostTimeRatios(NamedTuple):
    """A sliding visit's hosts' time out against their planned time."""

    total: float  # summed over its hosts: how its hosts flow through the train
    slowest: float  # its slowest host's own: what keeps a cycle open at its end


def visits_host_time(visits: dict[int, tuple[int, object]]) -> dict[int, HostTimeRatios]:
    """{visit: its hosts' time ratios} of the sliding visits given as {visit: (its train's overhead,
    what its plan kept under HOST_TIME_KEY)}: the kept value, else measured from the visit's tasks
    (sliding_visit_ratios; a visit that ended before visits kept it). Sizings and forecasts read this
    every tick; measuring ten visits' tasks each time was a twentieth of a simulation's time."""
    kept = {
        pk: HostTimeRatios(*map(float, stored))
        for pk, (_, stored) in visits.items()
        if isinstance(stored, list) and len(stored) == len(HostTimeRatios._fields)
    }
    measured = sliding_visit_ratios({pk: overhead for pk, (overhead, _) in visits.items() if pk not in kept})
    return {**measured, **kept}


def sliding_visit_ratios(overheads: dict[int, int]) -> dict[int, HostTimeRatios]:
    """{visit: its hosts' time out against their planned time} of the sliding visits given with
    their train's overhead (one query, none for no visit): each host's drain, from
    its admission to its return, against its planned chain (the overhead and the estimates of the
    visit's upgrades it took). Hosts flow through a sliding train, so its cycle follows their total,
    not its slowest host: the correction is the ratio of the sums. Without it a sliding train planned
    with the bare estimates and overran its cycles by a few percent in the many-upgrades regime."""
    if not overheads:
        return {}
    drains = (
        HostTask.objects.filter(
            operation__visit_link__visit_id__in=list(overheads), drain_key__isnull=False, admitted_at__isnull=False
        )
        .values("operation__visit_link__visit_id", "drain_key")
        .annotate(start=Min("admitted_at"), end=Max("finished_at"), work=Sum("operation__estimated_duration_s"))
        .order_by()
    )
    out: dict[int, float] = defaultdict(float)
    planned: dict[int, float] = defaultdict(float)
    slowest: dict[int, float] = defaultdict(float)
    for row in drains:
        if row["end"] is None:
            continue  # not finished: a done visit has none
        visit_id = row["operation__visit_link__visit_id"]
        took, plan = (row["end"] - row["start"]).total_seconds(), overheads[visit_id] + (row["work"] or 0)
        out[visit_id] += took
        planned[visit_id] += plan
        slowest[visit_id] = max(slowest[visit_id], took / plan if plan > 0 else 0.0)
    return {
        visit_id: HostTimeRatios(total=out[visit_id] / planned[visit_id], slowest=slowest[visit_id])
        for visit_id in out
        if planned[visit_id] > 0
    }


def factor_from(ratios: list[float]) -> float:
    """The correction from measured visits (real length over uncorrected cost): the ratio that
    MEASURED_QUANTILE of them stay at or under (nearest rank); 1 until enough were measured."""
    if len(ratios) < MIN_MEASURED:
        return 1.0
    low, high = FACTOR_BOUNDS
    return min(high, max(low, _quantile(ratios)))


def _quantile(values: Sequence[float]) -> float:
    """The value MEASURED_QUANTILE of `values` stay at or under (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(MEASURED_QUANTILE * len(ordered))) - 1]


def sizing_within_cycle(
    sizing: VisitSizing, *, train: Train, seconds_left: float, visits_left: int, in_flight_s: float = 0.0
) -> VisitSizing:
    """The sizing for a visit starting now in a cycle with `seconds_left` before its deadline and
    `visits_left` visits still to start (this one included): its budget is its share of the SLO, or
    of the time left if that is less (visit_concurrency visits run at once), so a cycle that fell
    behind catches up on the visits still to come. `in_flight_s`: what the hosts still out may take
    first (a sliding train's, `sliding_in_flight_s`), not available to the visits still to start;
    a sliding train's last visits are sized for their slowest hosts (`VisitSizing.tail`)."""
    if visits_left <= 0:
        return sizing
    lanes = train.visit_concurrency
    rounds = visit_rounds(visits_left, lanes)
    if train.emergency or seconds_left <= 0:
        return replace(sizing, budget_s=min(sizing.budget_s, max(0.0, seconds_left) / rounds), stretch_s=None)
    usable = max(0.0, seconds_left - in_flight_s)
    if train.pace == Pace.SLIDING and visits_left <= lanes:
        usable /= sizing.tail  # the last visits' slowest hosts end the cycle
    budget = min(sizing.budget_s, usable / rounds)
    # An upgrade too long for any visit's share runs where the rest of the cycle can give the time
    # (its other visits down to their overhead), and waits for a later cycle where it cannot: taken
    # anyway, it made every visit of a cycle overrun (25 domains of 5 h against a 72 h SLO).
    others = (visits_left - 1) * sizing.cost_s(sizing.largest_domain, [0.0])
    stretch = max(budget, min(usable, usable * lanes - others))
    return replace(sizing, budget_s=budget, stretch_s=stretch)


def sliding_in_flight_s(sizing: VisitSizing, running_plans: Iterable[dict]) -> float:
    """How long the hosts a sliding train still has out may keep the cycle open: as long as the
    slowest host of their visit takes (its corrected estimate per wave, times the train's tail), the
    longest of the running visits.
    A host released just before the last visit starts may need its whole chain, and the cycle ends
    when both are done, so the time left must cover this before the visits still to start. Without
    it, a sliding cycle that took long upgrades early overran its SLO by 1.4 h in the meta regime."""
    longest = 0.0
    for plan in running_plans:
        hosts = len(plan.get("hosts") or [])
        if hosts:
            longest = max(longest, float(plan.get("estimate_s") or 0) / sizing.waves(hosts))
    return longest * sizing.tail


@dataclass
class Selection:
    """The upgrades a visit takes (in order) and the ones it leaves for the next cycle."""

    taken: list = field(default_factory=list)
    left: list = field(default_factory=list)
    cost_s: float = 0.0
    over_budget: bool = False  # the first upgrade alone did not fit: taken anyway, and said


def select_within_budget(
    candidates: Sequence[T],
    *,
    sizing: VisitSizing,
    hosts_of: Callable[[T], set[int]],
    work_of: Callable[[T], float],
    restrict: Callable[[T, set[int]], T] | None = None,
    running: Mapping[int, float] | None = None,
) -> Selection:
    """First fit in the given order: each candidate joins the visit if the visit still fits the
    budget with it. A visit lasts as long as its busiest host, so the cost counts, per host, the
    work of the candidates it is in: a long upgrade retried on one host does not keep the others
    from their upgrades. With `restrict` (a candidate narrowed to some hosts), a candidate that does
    not fit on every host is taken on the hosts where it fits and left for the next cycle on the
    others. The first one is taken even alone over the budget (the train says so), so a backlog
    never stops moving, unless it overruns what the rest of the cycle can give (`stretch_s`): then
    it waits for a cycle with the time, and the visit takes what fits. Once the first has made a
    domain-paced visit longer than its budget, what does not make it longer still fits
    (`VisitSizing.waits_for_busiest`): in a meta run a kernel left on two hosts of a domain
    stretched its visit, and the other 38 hosts, idle those hours, waited a whole cycle for the
    upgrades that would have fitted beside it. `running`: per host, the work a running visit
    already gives it (late joiners): priced with it, and no candidate is taken over the budget
    (the visit took its first long ago)."""
    selection = Selection()
    chains: dict[int, float] = dict(running or {})  # host -> the work it does in this visit
    # The longest chain (kept as work is added: the forecast plays this a lot).
    busiest = max(chains.values(), default=0.0)
    if chains:
        selection.cost_s = sizing.cost_s(len(chains), [busiest])
    for candidate in candidates:
        its_hosts, work = hosts_of(candidate), work_of(candidate)
        hosts = chains.keys() | its_hosts
        cost = _chain_cost(sizing, chains, its_hosts, work, len(hosts), busiest)
        limit = max(sizing.budget_s, selection.cost_s) if sizing.waits_for_busiest else sizing.budget_s
        first = running is None and not selection.taken
        if cost <= limit or (first and (sizing.stretch_s is None or cost <= sizing.stretch_s)):
            selection.over_budget = selection.over_budget or cost > sizing.budget_s
            fitting = its_hosts
        else:  # per host: some may fit (sliding: all of them may, beside a host already over the budget)
            fitting = _fitting_hosts(sizing, chains, its_hosts, work, len(hosts), limit)
        if fitting == its_hosts:
            selection.taken.append(candidate)
        elif restrict is None or not fitting:
            selection.left.append(candidate)
            continue
        else:
            selection.taken.append(restrict(candidate, fitting))
            selection.left.append(restrict(candidate, its_hosts - fitting))
        busiest = max(busiest, _add_work(chains, fitting, work))
        selection.cost_s = sizing.cost_s(len(chains), [busiest])
    return selection


def steps_cost_s(
    sizing: VisitSizing,
    candidates: Iterable[T],
    *,
    hosts_of: Callable[[T], set[int]],
    work_of: Callable[[T], float],
    running: Mapping[int, float] | None = None,
) -> float:
    """What select_within_budget says `candidates`, all taken (beside the `running` visit's work),
    cost: their busiest host's chain."""
    chains: dict[int, float] = dict(running or {})
    busiest = max(chains.values(), default=0.0)
    for candidate in candidates:
        busiest = max(busiest, _add_work(chains, hosts_of(candidate), work_of(candidate)))
    return sizing.cost_s(len(chains), [busiest])


def _chain_cost(
    sizing: VisitSizing, chains: dict[int, float], more: set[int], work: float, hosts: int, busiest: float
) -> float:
    """The visit's cost over `hosts` hosts with `work` added on the hosts in `more`: its busiest
    host's (`busiest`: the longest of `chains`)."""
    longest = max((chains.get(h, 0.0) + work for h in more), default=0.0)
    return sizing.cost_s(hosts, [max(longest, busiest)])


def _fitting_hosts(
    sizing: VisitSizing, chains: dict[int, float], its_hosts: set[int], work: float, hosts: int, limit: float
) -> set[int]:
    """The hosts of `its_hosts` where `work` keeps the visit over `hosts` hosts within `limit`. A
    domain-paced visit lasts as long as its busiest host, so a host's cost is the visit's with the
    work on it; a sliding visit's host is out for its own work alone, so its own chain's (a long
    upgrade left on one host keeps no other host from its work). The busiest chain is found once,
    and each distinct chain priced once, not once per host: most hosts of a domain carry the same
    work, and the forecast plays this for every upgrade of every visit it plays."""
    busiest = max(chains.values(), default=0.0) if sizing.waits_for_busiest else None
    fits: dict[float, bool] = {}
    for chain in {chains.get(host, 0.0) + work for host in its_hosts}:
        fits[chain] = sizing.cost_s(hosts, [chain if busiest is None else max(chain, busiest)]) <= limit
    return {host for host in its_hosts if fits[chains.get(host, 0.0) + work]}


def _add_work(chains: dict[int, float], hosts: set[int], work: float) -> float:
    """Add `work` to the chains of `hosts`; the longest of those chains (0 without hosts)."""
    longest = 0.0
    for host in hosts:
        chains[host] = chain = chains.get(host, 0.0) + work
        longest = max(longest, chain)
    return longest


# --- the train says at once when one upgrade cannot fit a visit ---------------------------------------
def overrun_reason(train: Train, upgrade: Upgrade, sizing: VisitSizing) -> str:
    """Empty when the upgrade alone fits a visit of its largest domain; else the numbers and what
    budget, buffer or domain size would fit."""
    hosts = sizing.largest_domain
    if upgrade.multi_cycle and upgrade.hosts_per_visit:  # a visit takes at most that many (visits.py)
        hosts = min(hosts, upgrade.hosts_per_visit)
    cost = sizing.cost_s(hosts, [sizing.work_s(upgrade)])
    if cost <= sizing.budget_s:
        return ""
    waves = sizing.waves(hosts)
    per_wave = sizing.cost_s(min(hosts, sizing.hosts_at_once), [sizing.work_s(upgrade)])  # one wave
    rounds = visit_rounds(sizing.domains, train.visit_concurrency)
    needed_slo = math.ceil(cost * rounds)
    fixes = [f"a cycle SLO of at least {needed_slo} s (now {train.cycle_slo_s} s)"]
    if waves > 1 and per_wave <= sizing.budget_s:
        fits = max(1, int(sizing.budget_s // per_wave))  # waves that fit the budget
        fixes.append(f"a planned buffer of at least {math.ceil(hosts / fits) * train.visit_concurrency} hosts")
        bounded = upgrade.multi_cycle and upgrade.hosts_per_visit
        fixes.append(
            f"{'at most' if bounded else 'domains of at most'} {fits * sizing.hosts_at_once} hosts"
            + (" per visit" if bounded else "")
        )
    share = f"{train.cycle_slo_s} s over {sizing.domains} domains"
    if rounds != sizing.domains:
        share = (
            f"{train.cycle_slo_s} s over {rounds} visits in a row: {sizing.domains} domains, "
            f"{train.visit_concurrency} at once"
        )
    return (
        f"upgrade #{upgrade.pk} ({upgrade.component_version}) needs {cost:.0f} s per visit "
        f"({waves} wave(s) of {per_wave:.0f} s: {sizing.overhead_s} s overhead + {sizing.work_s(upgrade)} s work, "
        f"corrected by recent visits, on {_hosts_taken(upgrade, hosts)}, "
        f"{sizing.hosts_at_once} at once) against a budget of {sizing.budget_s:.0f} s "
        f"({share}); it would fit with " + " or ".join(fixes)
    )


def _hosts_taken(upgrade: Upgrade, hosts: int) -> str:
    if upgrade.multi_cycle and upgrade.hosts_per_visit:
        return f"up to {hosts} hosts a visit (its hosts per visit)"
    return f"domains of up to {hosts} hosts"


def train_budget_check(*, train: Train, upgrades: Sequence[Upgrade], sizing: VisitSizing | None = None) -> str:
    """Record on the train (code and reason) whether its active upgrades each fit one visit, with an
    alert when that changes to no; clear it when they fit again. Runs in the caller's transaction."""
    sizing = sizing or train_sizing(train)
    reasons = [r for r in (overrun_reason(train, u, sizing) for u in upgrades) if r]
    reason = "; ".join(reasons)[:500]
    code = BudgetCode.UPGRADE_TOO_LONG if reason else BudgetCode.NONE
    if (code, reason) == (train.budget_code, train.budget_reason):
        return reason
    Train.objects.filter(pk=train.pk).update(budget_code=code, budget_reason=reason)
    train.budget_code, train.budget_reason = code, reason
    if reason:
        event_record(
            kind="alert.train_visit_over_budget",
            subject=train,
            actor=ACTOR,
            reason=f"train {train.name} cannot keep its {train.cycle_slo_s} s cycle: {reason}",
            pool_id=train.pool_id,
            data={"train": train.pk, "budget_s": round(sizing.budget_s), "upgrades": [u.pk for u in upgrades]},
        )
    else:
        event_record(
            kind="train.visit_budget_fits",
            subject=train,
            actor=ACTOR,
            reason=f"every active upgrade fits a visit of {sizing.budget_s:.0f} s again",
            pool_id=train.pool_id,
            data={"train": train.pk},
        )
    return reason

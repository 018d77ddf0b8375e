"""Set-based reads for the trains and upgrades pages: a fixed number of queries however many
trains or upgrades are shown (the per-object selectors cost a few queries each).

`trains_forecasts` is the one forecast: `trains.selectors.train_forecast` asks it for one train."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field

from django.db.models import F, Func, IntegerField, Max, OuterRef, Q, QuerySet, Subquery

from fleet.models import ComponentVersion, MaintenanceDomain
from opsplanner import clock
from opsplanner.models import Approval, ApprovalKind, ApprovalState, Event, HostTask
from opsplanner.prepared import IDS, PreparedModels, PreparedQuery
from trains.models import (
    Cycle,
    Train,
    TrainState,
    TrainStop,
    Upgrade,
    UpgradePhase,
    UpgradeState,
    Visit,
    VisitState,
)
from trains.selectors import DomainForecast, TrainForecast, forecast_from_rows
from trains.selectors_forecast import UpgradeForecast, upgrades_forecasts
from trains.selectors_promise import UpgradePromise, upgrade_promise
from trains.services.budget import Correction, correction_from, recent_visits, train_overhead_s, visits_host_time
from trains.services.upgrades import SUBJECT as UPGRADE_SUBJECT
from trains.services.upgrades import phase_failures_while_in_force, phase_successes

# Finished trains and upgrades stay on the pages this long, then only the API and the admin show them.
FINISHED_SHOWN_FOR = dt.timedelta(days=7)
LIST_FORECAST_ROWS = 8  # the list shows the next few domains; the detail page shows them all
RECENT_EVENTS = 20
UPGRADE_STATE_ORDER = [UpgradeState.OFFBOARDED, UpgradeState.ACTIVE, UpgradeState.COMPLETED, UpgradeState.CANCELLED]


# --- trains -----------------------------------------------------------------------------------------
def duration_text(seconds: float) -> str:
    """7 d, 36 h, 45 min, 30 s: the largest unit that reads as a round number, else seconds."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size:.0f} {unit}"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


@dataclass
class SkipRow:
    domain: str
    skips: int
    reason: str  # empty once the train came back and visited the domain
    state: str


@dataclass
class TrainRow:
    train: Train
    forecast: TrainForecast
    stops: int
    visits_done: int
    skipped: list[SkipRow] = field(default_factory=list)

    @property
    def cycle(self) -> Cycle | None:
        return self.forecast.cycle

    @property
    def slo_text(self) -> str:
        return duration_text(self.train.cycle_slo_s)

    @property
    def visit_text(self) -> str:
        return duration_text(round(self.forecast.visit_seconds))

    @property
    def remaining(self) -> list[DomainForecast]:
        """The domains still to visit in this cycle, soonest first."""
        waiting = [d for d in self.forecast.domains if d.state != VisitState.DONE and d.starts_at is not None]
        return sorted(waiting, key=lambda d: (d.starts_at, d.position))

    @property
    def upcoming(self) -> list[DomainForecast]:
        """The next few of them, for the list."""
        return self.remaining[:LIST_FORECAST_ROWS]


def trains_shown(
    *, pool_id: int | None = None, train_id: int | None = None, now: dt.datetime | None = None
) -> list[Train]:
    """Every train that is not long finished, with its pool (one query)."""
    now = now or clock.now()
    trains = Train.objects.select_related("pool", "upgrade__component_version__component")
    if train_id is not None:
        return list(trains.filter(pk=train_id))
    if pool_id is not None:
        trains = trains.filter(pool_id=pool_id)
    ended = Q(state__in=[TrainState.FINISHED, TrainState.CANCELLED], state_changed_at__lt=now - FINISHED_SHOWN_FOR)
    return list(trains.exclude(ended).order_by("pool__name", "emergency", "name"))


# The train tick forecasts at every tick (and the pages at every view): compiled once (opsplanner/prepared.py).
_LAST_VISITS = PreparedQuery(  # per train and domain, when its last visit ended
    lambda *, ids: (
        Visit.objects.filter(train_id__any=ids, state=VisitState.DONE)
        .values("train_id", "domain_id")
        .annotate(at=Max("ended_at"))
        .order_by()
        .values_list("train_id", "domain_id", "at")
    ),
    ids=IDS,
)
# The latest cycle of each train: the open one, or the number the next cycle follows.
# (A subquery, not DISTINCT ON: the embedded default runs on SQLite.)
_LATEST_CYCLES = PreparedModels(
    lambda *, ids: Cycle.objects.filter(
        train_id__any=ids,
        number=Subquery(Cycle.objects.filter(train_id=OuterRef("train_id")).order_by("-number").values("number")[:1]),
    ),
    ids=IDS,
)
_CYCLES_VISITS = PreparedModels(lambda *, ids: Visit.objects.filter(cycle_id__any=ids).order_by(), ids=IDS)
_STOPS = PreparedModels(
    lambda *, ids: (
        TrainStop.objects.filter(train_id__any=ids).select_related("domain").order_by("train_id", "position")
    ),
    ids=IDS,
)


def _visit_seconds(
    trains: list[Train], newest_cycles: dict[int, int]
) -> tuple[dict[int, list[float]], dict[int, Correction]]:
    """Per train, the lengths of its recent visits that took work (budget.recent_visits), newest
    first, and the measured correction of its estimates (budget.correction_from, as the train tick
    measures it; one query, two with sliding visits that kept no host time). A sliding visit (its
    plan counts the hosts it "released") overlaps the visit before it: its length is what it added
    after that one ended."""
    overhead = {t.pk: train_overhead_s(t) for t in trains}
    rows = recent_visits({train_id: newest_cycles.get(train_id, 0) for train_id in overhead})
    by_hosts = visits_host_time(
        {v.pk: (overhead[train_id], v.host_time) for train_id, vs in rows.items() for v in vs if v.released is not None}
    )
    lengths: dict[int, list[float]] = defaultdict(list)
    corrections: dict[int, Correction] = {}
    for train_id, visits in rows.items():
        for i, visit in enumerate(visits):
            older_end = visits[i + 1].ended_at if visit.released is not None and i + 1 < len(visits) else None
            lengths[train_id].append(
                (visit.ended_at - max(visit.started_at, older_end or visit.started_at)).total_seconds()
            )
        corrections[train_id] = correction_from(visits, by_hosts)
    return lengths, corrections


def trains_forecasts(
    trains: list[Train], *, now: dt.datetime | None = None, last_visits: bool = True
) -> dict[int, TrainForecast]:
    """`train_forecast` for each train, in five queries in all (six with sliding visits that kept no
    host time). Without `last_visits` the domains' `last_visited_at` stay empty, one query fewer:
    the train tick and the upgrades' forecast, which read only the times to come, ask at every tick."""
    return _read_trains(trains, now or clock.now(), last_visits=last_visits)[0]


def trains_forecasts_with_visits(
    trains: list[Train], *, now: dt.datetime | None = None, last_visits: bool = True
) -> tuple[dict[int, TrainForecast], dict[int, dict[int, Visit]]]:
    """The forecasts, and the visits of each train's open cycle by domain (five queries, six with
    sliding visits that kept no host time; one fewer without `last_visits`, as trains_forecasts)."""
    return _read_trains(trains, now or clock.now(), last_visits=last_visits)


def _read_trains(
    trains: list[Train], now: dt.datetime, *, last_visits: bool = True
) -> tuple[dict[int, TrainForecast], dict[int, dict[int, Visit]]]:
    """The forecasts, and the visits of each train's open cycle by domain."""
    ids = [t.pk for t in trains]
    if not ids:
        return {}, {}
    latest = {c.train_id: c for c in _LATEST_CYCLES.objects(ids=ids)}
    cycles = {train_id: c for train_id, c in latest.items() if c.ended_at is None}
    recent, corrections = _visit_seconds(trains, {train_id: c.number for train_id, c in latest.items()})
    last: dict[int, dict[int, dt.datetime]] = defaultdict(dict)
    for train_id, domain_id, at in _LAST_VISITS.rows(ids=ids) if last_visits else ():
        last[train_id][domain_id] = at
    visits: dict[int, dict[int, Visit]] = defaultdict(dict)
    for visit in _CYCLES_VISITS.objects(ids=[c.pk for c in cycles.values()]):
        visits[visit.train_id][visit.domain_id] = visit
    stops: dict[int, list[TrainStop]] = defaultdict(list)
    for stop in _STOPS.objects(ids=ids):
        stops[stop.train_id].append(stop)
    forecasts = {}
    for train in trains:
        lengths = recent.get(train.pk)
        seconds = sum(lengths) / len(lengths) if lengths else float(train.visit_estimate_s)
        forecasts[train.pk] = forecast_from_rows(
            train, cycles.get(train.pk), seconds, last[train.pk], visits[train.pk], stops[train.pk], now
        )
        forecasts[train.pk].last_cycle_number = latest[train.pk].number if train.pk in latest else 0
        forecasts[train.pk].correction = corrections.get(train.pk, Correction())
    return forecasts, visits


def train_rows(trains: list[Train], *, now: dt.datetime | None = None) -> list[TrainRow]:
    forecasts, visits = _read_trains(trains, now or clock.now())
    rows = []
    for train in trains:
        forecast = forecasts[train.pk]
        names = {d.domain_id: d.domain for d in forecast.domains}
        current = sorted(visits.get(train.pk, {}).values(), key=lambda v: v.position)
        rows.append(
            TrainRow(
                train=train,
                forecast=forecast,
                stops=len(forecast.domains),
                visits_done=sum(1 for v in current if v.state == VisitState.DONE),
                # The current cycle's skips, still counted after the train came back to the domain.
                skipped=[
                    SkipRow(
                        domain=names.get(v.domain_id, str(v.domain_id)),
                        skips=v.skips,
                        reason=v.skip_reason,
                        state=v.state,
                    )
                    for v in current
                    if v.skips
                ],
            )
        )
    return rows


def train_events(train: Train) -> list[Event]:
    """The train's own events and those of its cycles and visits (which name the train)."""
    return list(
        Event.objects.filter(pool_id=train.pool_id)
        .filter(Q(subject_type="trains.train", subject_id=train.pk) | Q(data__train=train.pk))
        .order_by("-created_at", "-id")[:RECENT_EVENTS]
    )


# --- upgrades ---------------------------------------------------------------------------------------
@dataclass
class PhaseRow:
    phase: UpgradePhase
    successes: int
    failures: int
    in_force: bool

    @property
    def covers(self) -> str:
        domain = self.phase.domain
        return f"domain {domain.name}" if domain is not None else f"{self.phase.percent}% of the scope"

    @property
    def status(self) -> str:
        if self.phase.graduated_at is not None:
            return "graduated"
        return "in force" if self.in_force else "waiting"


@dataclass
class UpgradeRow:
    upgrade: Upgrade
    phases: list[PhaseRow]
    reonboard: Approval | None  # a pending request to re-onboard it
    forecast: UpgradeForecast | None = None  # when it reaches every host (active upgrades)
    promise: UpgradePromise | None = None  # its first forecast, against what happened

    @property
    def reonboard_state(self) -> str:
        return "pending" if self.reonboard is not None else "none"

    @property
    def failure_rate_percent(self) -> str:
        rate = self.upgrade.max_failure_rate
        return "" if rate is None else f"{float(rate) * 100:g}"


def upgrades_shown(
    *, pool_id: int | None = None, upgrade_id: int | None = None, state: str = "", now: dt.datetime | None = None
) -> list[Upgrade]:
    """Offboarded first (they need a decision), then active, then recently finished (one query)."""
    now = now or clock.now()
    upgrades = Upgrade.objects.select_related("pool", "component_version__component")
    if upgrade_id is not None:
        return list(upgrades.filter(pk=upgrade_id))
    if pool_id is not None:
        upgrades = upgrades.filter(pool_id=pool_id)
    if state:
        upgrades = upgrades.filter(state=state)
    ended = Q(state__in=[UpgradeState.COMPLETED, UpgradeState.CANCELLED], finished_at__lt=now - FINISHED_SHOWN_FOR)
    rank = {s.value: i for i, s in enumerate(UPGRADE_STATE_ORDER)}
    return sorted(upgrades.exclude(ended), key=lambda u: (rank.get(u.state, 99), -u.created_at.timestamp(), -u.pk))


def _count(
    tasks: QuerySet[HostTask], expression: str = "%(function)s(%(expressions)s)", column: str = "id"
) -> Subquery:
    return Subquery(
        tasks.order_by().annotate(n=Func(F(column), function="COUNT", template=expression)).values("n"),
        output_field=IntegerField(),
    )


def phases_with_counts(upgrade_ids: list[int]) -> list[UpgradePhase]:
    """Each phase with `successes` and `failures` (phase_successes and phase_failures, the
    definitions the train tick counts with; one query for every phase of every upgrade). A graduated
    phase shows the failures counted while it was in force (phase_failures_while_in_force): a later
    failure of its tasks counts against the phase in force, and shows there only."""
    return list(
        UpgradePhase.objects.filter(upgrade_id__in=upgrade_ids)
        .select_related("domain")
        .annotate(failures=phase_failures_while_in_force(), successes=phase_successes())
        .order_by("upgrade_id", "position")
    )


def upgrade_rows(upgrades: list[Upgrade]) -> list[UpgradeRow]:
    """Upgrades with their phases' counts, any pending re-onboarding request, the forecast of the
    active ones (a fixed number of queries: selectors_forecast.upgrades_forecasts) and each one's
    promise held against what happened."""
    ids = [u.pk for u in upgrades]
    if not ids:
        return []
    forecasts = upgrades_forecasts(upgrades)
    now = clock.now()
    phases: dict[int, list[UpgradePhase]] = defaultdict(list)
    for phase in phases_with_counts(ids):
        phases[phase.upgrade_id].append(phase)
    pending = {
        a.subject_id: a
        for a in Approval.objects.filter(
            kind=ApprovalKind.REONBOARD_UPGRADE,
            subject_type=UPGRADE_SUBJECT,
            subject_id__in=ids,
            state=ApprovalState.PENDING,
        )
    }
    return [
        UpgradeRow(
            upgrade=upgrade,
            phases=[
                PhaseRow(
                    phase=p,
                    successes=p.successes,  # type: ignore[attr-defined]
                    failures=p.failures,  # type: ignore[attr-defined]
                    in_force=upgrade.state == UpgradeState.ACTIVE and p.position == upgrade.current_phase,
                )
                for p in phases[upgrade.pk]
            ],
            reonboard=pending.get(upgrade.pk),
            forecast=forecasts.get(upgrade.pk),
            promise=upgrade_promise(upgrade, now=now),
        )
        for upgrade in upgrades
    ]


def upgrade_events(upgrade: Upgrade) -> list[Event]:
    """The upgrade's events and those of the requests to re-onboard it (asked, approved, rejected)."""
    requests = Approval.objects.filter(
        kind=ApprovalKind.REONBOARD_UPGRADE, subject_type=UPGRADE_SUBJECT, subject_id=upgrade.pk
    ).values("id")
    return list(
        Event.objects.filter(
            Q(subject_type=UPGRADE_SUBJECT, subject_id=upgrade.pk)
            | Q(subject_type=Approval._meta.label_lower, subject_id__in=requests)
        ).order_by("-created_at", "-id")[:RECENT_EVENTS]
    )


# --- the forms --------------------------------------------------------------------------------------
CATALOGUE_ROWS = 2000  # versions offered by the upgrade form (newest first within a component)
DOMAIN_SUGGESTIONS = 1000


def train_get(pk: int) -> Train | None:
    """One train with its pool, for its forms (None when there is none)."""
    return Train.objects.select_related("pool").filter(pk=pk).first()


def train_domain_order(train: Train) -> list[str]:
    return list(train.stops.order_by("position").values_list("domain__name", flat=True))


def upgrade_get(pk: int) -> Upgrade | None:
    """One upgrade with its pool and target, for the offboard form (None when there is none)."""
    return Upgrade.objects.select_related("pool", "component_version__component").filter(pk=pk).first()


def version_choices() -> list[tuple[str, list[tuple[str, str]]]]:
    """The catalogue as grouped choices: per component, its versions newest first; a withdrawn one
    stays choosable and says so (the service refuses it with the reason)."""
    groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
    rows = ComponentVersion.objects.order_by("component__name", "-sort_key").values_list(
        "component__name", "version", "withdrawn_at"
    )[:CATALOGUE_ROWS]
    for component, version, withdrawn_at in rows:
        groups[component].append((version, f"{version} (withdrawn)" if withdrawn_at else version))
    return list(groups.items())


def domain_suggestions() -> list[tuple[str, str]]:
    """(pool, domain) names for the phase rows' suggestions."""
    rows = MaintenanceDomain.objects.order_by("pool__name", "position", "name").values_list("pool__name", "name")
    return list(rows[:DOMAIN_SUGGESTIONS])

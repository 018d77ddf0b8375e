"""The per-upgrade forecast's view of the running visits (trains/selectors_forecast.py): what each
has yet to install, and the upgrades created during it that the train's next tick lets join it."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from django.db.models import Count

from opsplanner.models import HostTask
from opsplanner.prepared import IDS, PreparedQuery
from trains.models import Upgrade, Visit, VisitState
from trains.services.budget import VisitSizing, upgrade_order_key
from trains.services.visits import JOINABLE_TASK_STATES, REFUSED_KEY, late_joiner_candidates, unreleased_hosts


@dataclass
class RunningVisit:
    """A running visit's work still to come: per upgrade, its hosts the visit has yet to install it
    on; how many of the visit's hosts are still drained or not yet released (an upgrade created now
    may join those); and how much longer than its plan's estimate the joins expected make it."""

    takes: dict[int, int]
    hosts_joinable: int
    extra_s: float = 0.0


_LINK = "operation__visit_link__"
# Per running visit and upgrade, its tasks not installed yet; every per-upgrade forecast reads it, and
# the train tick's played cycle (services/cycle_played.py): compiled once.
_UNFINISHED = PreparedQuery(
    lambda *, ids: (
        HostTask.objects.filter(
            **{f"{_LINK}visit__train_id__any": ids, f"{_LINK}visit__state": VisitState.RUNNING},
            **{f"{_LINK}catch_up": False},
            state__in=JOINABLE_TASK_STATES,  # before the install: the host is still below the target
        )
        .values_list(f"{_LINK}visit_id", f"{_LINK}upgrade_id")
        .annotate(n=Count("id"))
        .order_by()
    ),
    ids=IDS,
)


def running_visits_takes(train_ids: list[int], visits: list[Visit]) -> dict[int, RunningVisit]:
    """Per running visit, per upgrade, how many of its hosts the visit has yet to install it on: the
    hosts still below its target that the visit reaches (one grouped query, asked by train so the
    forecast's count stays pinned whether a visit runs or not). Those it installed already are no
    longer pending (the installed versions say so), and are not taken off again. Its own tasks before
    their install, joined ones too (a catch-up's are the repair's); a sliding visit's hosts not yet
    released; an upgrade it refused as incompatible, none. An older release a newer one supersedes
    gets the share of its hosts the newer one still has to reach (the plan counts them, not which)."""
    running = [v for v in visits if v.state == VisitState.RUNNING]
    unfinished: dict[tuple[int, int], int] = defaultdict(int)
    for visit_id, upgrade_id, n in _UNFINISHED.rows(ids=train_ids):
        unfinished[(visit_id, upgrade_id)] = n
    takes: dict[int, RunningVisit] = {}
    for visit in running:
        plan = visit.plan or {}
        refused = set(plan.get(REFUSED_KEY, []))
        # Every drained host has a task of some upgrade not installed yet: the most any has is a floor.
        drained = max((n for (visit_id, _), n in unfinished.items() if visit_id == visit.pk), default=0)
        for entry in plan.get("unreleased", []):
            unfinished[(visit.pk, entry["upgrade"])] += len(entry["hosts"])
        its: dict[int, int] = defaultdict(int)
        for entry in plan.get("upgrades", []):  # those it started with, then those that joined it
            upgrade_id = int(entry["upgrade"])
            if upgrade_id in refused or upgrade_id in its:
                continue
            left = unfinished.get((visit.pk, upgrade_id), 0)
            its[upgrade_id] = left
            planned = int(entry.get("hosts", 0))
            for older, hosts in (entry.get("supersedes") or {}).items():
                its[int(older)] += round(int(hosts) * left / planned) if planned else 0
        its_hosts = {upgrade_id: hosts for upgrade_id, hosts in its.items() if hosts}
        takes[visit.pk] = RunningVisit(its_hosts, drained + len(unreleased_hosts(visit)))
    return takes


def joins_expected(
    running: list[Visit],
    takes: dict[int, RunningVisit],
    *,
    upgrades: list[Upgrade],
    pending: dict[int, dict[int, int]],
    sizing: VisitSizing,
) -> None:
    """The upgrades created during a running visit that the train's next tick lets join it
    (visits.late_joiner_candidates: the forecast is read, and the promise made, as the upgrade is
    created, before it joined), each in (priority, deadline, age) order on the visit's hosts still
    drained or not yet released that it has pending there (`pending`: upgrade -> domain -> hosts), as
    long as the visit stays within the budget it was given, added to `takes` with the visit longer by
    its work (no query). Approximations: its pending hosts are taken to be among those, and every
    host to carry the visit's busiest chain."""
    candidates = late_joiner_candidates(running, upgrades)
    for visit in running:
        its = takes[visit.pk]
        plan, hosts = visit.plan or {}, len((visit.plan or {}).get("hosts", []))
        waves = sizing.waves(hosts)
        if not its.hosts_joinable or not waves:
            continue
        busiest = max(0.0, float(plan.get("cost_s", 0)) / waves - sizing.overhead_s)  # its plan's chain
        budget = min(sizing.budget_s, float(plan.get("budget_s", sizing.budget_s)))
        planned = sizing.cost_s(hosts, [busiest])
        for upgrade in sorted(candidates.get(visit.pk, []), key=upgrade_order_key):
            left = pending.get(upgrade.pk, {}).get(visit.domain_id, 0)
            longer = sizing.cost_s(hosts, [busiest + sizing.work_s(upgrade)])
            if not left or longer > budget:
                continue
            its.takes[upgrade.pk] = its.takes.get(upgrade.pk, 0) + min(left, its.hosts_joinable)
            busiest += sizing.work_s(upgrade)
            its.extra_s += longer - planned
            planned = longer

"""Where a multi-cycle release's places go in a visit: the one rule the visits (trains/services/
visits.py) and the forecast that plays them (trains/selectors_forecast.py) both apply.

A multi-cycle upgrade takes at most its hosts_per_visit hosts of a visit. Chosen before the budget,
by id, a place could fall on a host an upgrade ahead of it had filled: the budget dropped it there,
and the upgrade took no host though it fitted on the domain's others. So the candidates are made
again with the hosts where it did not fit ranked last, until no such upgrade is left on a host
another could replace (`select_ranked`; each round marks one more host at least, most rounds all of
them; no query)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TypeVar

from trains.models import Upgrade
from trains.services.budget import Selection, VisitSizing, select_within_budget

T = TypeVar("T")
Marks = dict[int, set[int]]  # per upgrade id, the hosts where its places do not fit the visit's budget


def visit_bound(upgrade: Upgrade) -> int | None:
    """The most hosts of a visit the upgrade takes (None: every one)."""
    return upgrade.hosts_per_visit if upgrade.multi_cycle else None


def within_hosts_per_visit(upgrade: Upgrade, hosts: set[int], rank: Callable[[int], tuple]) -> set[int]:
    """A multi-cycle upgrade's hosts of a visit, as the visit starts or as it joins late: at most its
    hosts_per_visit, the first by `rank` (bound_rank)."""
    bound = visit_bound(upgrade)
    if not bound or len(hosts) <= bound:
        return hosts
    return set(sorted(hosts, key=rank)[:bound])


def bound_rank(unfit: Collection[int], failed: Collection[int], older: list[set[int]]) -> Callable[[int], tuple]:
    """The order a multi-cycle upgrade's places go to hosts in: first those where it fits the visit's
    budget (select_ranked), then those that have not failed it (a host whose install keeps failing
    would otherwise take the one place each visit, and the rollout crawl at its pace), then those the
    most older releases of its component (`older`: their pending hosts) still wait for, then by id.
    By id alone, a newer release took the hosts an older multi-cycle one had already reached (the
    first by id, as its rollout goes) and superseded it nowhere: the older one kept its own pace,
    where the forecast counted the newer one's hosts as reached for it too; now one install takes a
    host past both, as the forecast plays it."""
    return lambda host: (host in unfit, host in failed, -sum(host in hosts for hosts in older), host)


def select_ranked(
    candidates_for: Callable[[Marks], list[T]],
    *,
    sizing: VisitSizing,
    hosts_of: Callable[[T], set[int]],
    work_of: Callable[[T], float],
    restrict: Callable[[T, set[int]], T],
    upgrade_of: Callable[[T], Upgrade],
    places_of: Callable[[T], set[int] | None],
    running: Mapping[int, float] | None = None,
) -> Selection:
    """select_within_budget of `candidates_for(marks)`, made again with the marks of each round until
    no multi-cycle candidate is left where another host could take its place. `places_of`: the hosts
    a candidate's places may go to (None: not bounded, or as many places as hosts); `running`: the
    work a running visit already gives its hosts (late joiners)."""
    marks: Marks = {}
    while True:
        candidates = candidates_for(marks)
        selection = select_within_budget(
            candidates, sizing=sizing, hosts_of=hosts_of, work_of=work_of, restrict=restrict, running=running
        )
        more = _unfit_marks(candidates, selection, hosts_of, work_of, upgrade_of, places_of, running)
        if all(hosts <= marks.get(upgrade_id, set()) for upgrade_id, hosts in more.items()):
            return selection
        for upgrade_id, hosts in more.items():
            marks.setdefault(upgrade_id, set()).update(hosts)


def _unfit_marks(
    candidates: list[T],
    selection: Selection,
    hosts_of: Callable[[T], set[int]],
    work_of: Callable[[T], float],
    upgrade_of: Callable[[T], Upgrade],
    places_of: Callable[[T], set[int] | None],
    running: Mapping[int, float] | None,
) -> Marks:
    """Per multi-cycle candidate the budget left on some of its hosts, the hosts where it does not fit
    either (costlier_hosts), from the work the candidates taken before it give each host."""
    left = {}
    for candidate in selection.left:
        places = places_of(candidate)
        if places is not None:
            left[upgrade_of(candidate).pk] = (hosts_of(candidate), places)
    if not left:
        return {}
    taken = {upgrade_of(c).pk: hosts_of(c) for c in selection.taken}
    ahead = dict(running or {})  # host in the visit -> the work the candidates taken before this one give it
    marks = {}
    for candidate in candidates:  # in the order the visit takes them
        upgrade_id = upgrade_of(candidate).pk
        if upgrade_id in left:
            marks[upgrade_id] = costlier_hosts(ahead, *left[upgrade_id])
        for host in taken.get(upgrade_id, ()):
            ahead[host] = ahead.get(host, 0.0) + work_of(candidate)
    return marks


def costlier_hosts(ahead: Mapping[int, float], left: set[int], host_ids: set[int]) -> set[int]:
    """The hosts where the same work costs the visit at least as much as on one of `left`:
    select_within_budget prices a host by its work ahead and, for a host not yet in the visit (not
    in `ahead`), by one host more (a wave more, maybe: a host's cost does not grow with its work
    alone). Where a new host was left, the new ones (its other places were priced with that host
    more and may fit without it); else the hosts in the visit with at least the work ahead of the
    least busy one it was left on."""
    if not left <= ahead.keys():
        return host_ids - ahead.keys()
    least = min(ahead[host] for host in left)
    return {host for host in host_ids if ahead.get(host, -1.0) >= least}

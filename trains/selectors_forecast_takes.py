"""What a played visit of the per-upgrade forecast takes (trains/selectors_forecast.py: `_visit_takes`),
as the train tick's visit would (trains/services/visits.py): per component the newest release on its
pending hosts and each older one on those no newer release claims, in (priority, deadline, age)
order within the visit's budget, a multi-cycle release at most its hosts_per_visit where it fits.
Hosts are numbered from 0 for each upgrade of a domain (the forecast counts them, not which). No query.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from trains.models import Upgrade
from trains.services.budget import Selection, VisitSizing, upgrade_order_key
from trains.services.places import bound_rank, select_ranked, visit_bound, within_hosts_per_visit


class Take(NamedTuple):
    """An upgrade on some of a domain's hosts, as a forecast visit takes it (hosts are numbered:
    those of different upgrades in one domain overlap)."""

    upgrade: Upgrade
    hosts: frozenset[int]


def ranked_takes(components: list[list[Upgrade]], counts: dict[int, int], sizing: VisitSizing) -> Selection:
    """What the visit takes, as the tick's visits._ranked_selection (trains/services/places.py:
    select_ranked): the takes within the budget (one that does not fit every host taken where it
    fits, the rest left for the next cycle), a multi-cycle release's places given again away from
    the hosts where it did not fit. Most visits leave no such release: one pass."""

    def places_of(take: Take) -> set[int] | None:
        bound, count = visit_bound(take.upgrade), counts[take.upgrade.pk]
        return set(range(count)) if bound and count > bound else None

    return select_ranked(
        lambda unfit: newest_first_takes(components, counts, unfit),
        sizing=sizing,
        hosts_of=lambda take: set(take.hosts),
        work_of=lambda take: sizing.work_s(take.upgrade),
        restrict=lambda take, some: Take(take.upgrade, frozenset(some)),
        upgrade_of=lambda take: take.upgrade,
        places_of=places_of,
    )


def newest_first_takes(components: Iterable[list[Upgrade]], counts: dict[int, int], unfit: dict) -> list[Take]:
    """The takes of a visit, as the tick's visits.domain_steps makes its steps: per component, the
    newest release on its pending hosts, each older one on those of its hosts no newer release
    claims (a narrower hotfix leaves the rest to the release it supersedes), each taking the best
    queue place of what it supersedes; a multi-cycle release takes at most its hosts_per_visit
    (`_places`), and the older releases the hosts it leaves. Hosts are numbered from 0 for every
    upgrade: an older release's pending hosts are taken to be the first ones a newer one has."""
    keyed: list[tuple[tuple, Take]] = []
    for releases in components:
        releases = sorted(releases, key=lambda u: u.component_version.sort_key, reverse=True)
        low, above = 0, set[int]()  # the hosts newer releases claim: every one below `low`, and `above`
        for i, upgrade in enumerate(releases):
            count = counts[upgrade.pk]
            if count <= low:
                continue
            free: Sequence[int] = range(low, count) if not above else [h for h in range(low, count) if h not in above]
            own = free
            if upgrade.multi_cycle and upgrade.hosts_per_visit and len(free) > upgrade.hosts_per_visit:
                own = _places(upgrade, free, unfit.get(upgrade.pk), releases[i + 1 :], counts)
            key = min(upgrade_order_key(u) for u in releases[i:] if counts[u.pk] > low)
            keyed.append((key, Take(upgrade, frozenset(own))))
            if isinstance(own, range):  # the first ones left (nothing claimed above them)
                low = own.stop
                continue
            above.update(own)
            while low in above:  # the older releases' hosts start at the first one left
                above.remove(low)
                low += 1
    return [take for _, take in sorted(keyed, key=lambda kt: kt[0])]


def _places(upgrade: Upgrade, free: Sequence[int], unfit: set | None, olders: list, counts: dict) -> Sequence[int]:
    """A multi-cycle release's hosts_per_visit places among its `free` hosts (ascending), by the
    visit's own rule (places.bound_rank): first where it fits the budget (`unfit`: those where it did
    not, `ranked_takes`), then those the most older releases still need, then by number. The older
    releases' pending hosts are the first numbers, so without unfit hosts that is the first ones.
    Approximations: which hosts failed it is not known (no query; none ranked as failed), and the other
    upgrades' work sits on the first numbers (they overlap), as for any take the budget narrows."""
    if not unfit:
        return free[: upgrade.hosts_per_visit]
    rank = bound_rank(unfit, set(), [set(range(counts[u.pk])) for u in olders])
    return sorted(within_hosts_per_visit(upgrade, set(free), rank))

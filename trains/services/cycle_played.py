"""The open cycle's visits to come at the seconds the per-upgrade forecast plays them at
(`selectors_forecast.played_durations`), stored on the cycle (`Cycle.played_s`) with a key of what
they were played from (`Cycle.played_key`): the visits of the cycle and their states (a visit
starts, ends, is skipped or cancelled), the pool's active upgrades with their phase in force and
what a replan changes, the train's state and lanes, and how many of the pool's hosts are out broken
or escalated. The train tick plays them again only when that key changes: playing reads five queries
or more (the pool's active upgrades, its domains' hosts, the installed versions, what recent visits
missed, the running visits' tasks; the forecast and visits are the tick's own) and one write, and at
every tick it made the train tick's forecast four times dearer (commit 62c2a65, reverted). Between
two changes the stored seconds stand: time passing alone (a cycle falling behind, whose later visits
the tick would give less) does not play them again, so a visit overrunning its plan pushes them past
the deadline and the cycle is alerted before it. The train's forecast
(trains.selectors.forecast_times) reads them wherever it is read: the tick, the pages and API (as
the last tick stored them; a page does not play). A sliding train's visits keep the lane
arithmetic's starts (its play starts them by its release rule): only their lengths are played."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterable

from fleet.models import HostState
from fleet.selectors.capacity import PoolCapacity
from trains.models import Cycle, Train, Upgrade, Visit
from trains.selectors import BROKEN_STATES, TrainForecast, forecast_times
from trains.selectors_forecast import active_upgrades, backlogs_of, played_durations


def played_key(train: Train, visits: Iterable[Visit], upgrades: Iterable[Upgrade], capacity: PoolCapacity) -> str:
    """What the open cycle's played seconds depend on that the train tick has at hand, hashed short
    (the cycle's own visits by domain, the pool's active regular upgrades, and its hosts out broken
    or escalated and in all, as the tick began: a rack's hosts breaking or coming back change what
    its visit takes without starting or ending a visit)."""
    out = ",".join(str(capacity.by_state.get(state, 0)) for state in (*BROKEN_STATES, HostState.ESCALATED))
    parts = [
        f"{train.state}:{train.visit_concurrency}:{capacity.total}:{out}",
        ",".join(f"{v.pk}{v.state[0]}{v.skips}" for v in sorted(visits, key=lambda v: v.pk)),
        ",".join(  # with what upgrade_replan changes: what a visit takes of each, in which order
            f"{u.pk}:{u.current_phase}:{u.priority}:{u.state}:{u.deadline}:{u.multi_cycle}:{u.hosts_per_visit}"
            for u in sorted(upgrades, key=lambda u: u.pk)
        ),
    ]
    return hashlib.blake2b("|".join(parts).encode(), digest_size=16).hexdigest()


def cycle_played_store(
    *, train: Train, forecast: TrainForecast, visits: dict[int, Visit], key: str, now: dt.datetime
) -> None:
    """Play the train's open cycle (its forecast and visits as just read) as the per-upgrade
    forecast does, store the seconds of its visits to come on the cycle with `key`, and time the
    forecast again with them (forecast_times: no query). Nothing played when its pool has no active
    upgrade (its visits keep the train's typical length: upgrades keep arriving), or for an
    emergency train (its upgrade is not in that forecast)."""
    cycle = forecast.cycle
    assert cycle is not None, "only an open cycle is played"
    played: dict[str, float] = {}
    upgrades = [] if train.emergency else active_upgrades([train.pool_id])
    if upgrades:
        backlog = backlogs_of([train], upgrades, ({train.pk: forecast}, {train.pk: visits}), now=now)[train.pool_id]
        played = {str(domain_id): s for domain_id, s in played_durations(backlog, now=now).items()}
    Cycle.objects.filter(pk=cycle.pk).update(played_s=played, played_key=key)
    cycle.played_s, cycle.played_key = played, key
    forecast_times(forecast, visits, now)

"""The train's own forecast (the trains pages and API, the Gantt's dashed visits, the tick's
alert.cycle_will_miss) at the times the per-upgrade forecast plays its visits: the open cycle's
(none open, the next one's) running visits until their plan's estimate, the visits to come lasting
what they will take (`selectors_forecast.played_cycle`, the one play). Read at the train's typical
visit instead (visit_estimate_s until visits are measured), a 3-rack pool whose one upgrade made
each visit 1800 s had its cycle forecast to end 87 minutes before the upgrade's forecast reached its
last host, on the same Gantt (a reviewer's probe, h62). A train with no active upgrade in its pool
keeps the lane forecast (`trains.selectors.forecast_from_rows`): nothing better is known. An
emergency train's upgrades are not in the per-upgrade forecast: it keeps it too."""

from __future__ import annotations

import datetime as dt

from trains.models import LIVE_TRAIN_STATES, Train, Visit, VisitState
from trains.selectors import TrainForecast, forecast_judge
from trains.selectors_forecast import active_upgrades, backlogs_of, played_cycle


def trains_played(
    trains: list[Train], forecasts: dict[int, TrainForecast], visits: dict[int, dict[int, Visit]], *, now: dt.datetime
) -> None:
    """Each live regular train of `trains` whose pool has an active upgrade: its forecast's times
    (the lane forecasts `forecasts`, changed in place) as the per-upgrade forecast plays them. One
    query when no pool has an active upgrade; with one, what the backlogs read (FORECAST_QUERIES
    less the trains and their lane forecasts), for every train at once."""
    regular = [t for t in trains if not t.emergency and t.state in LIVE_TRAIN_STATES]
    if not regular:
        return
    upgrades = active_upgrades(sorted({t.pool_id for t in regular}))
    pools = {u.pool_id: u.pool for u in upgrades}
    regular = [t for t in regular if t.pool_id in pools]
    if not regular:
        return
    for train in regular:  # the pools came with their upgrades: not one query per train for its pool
        if not Train.pool.is_cached(train):
            train.pool = pools[train.pool_id]
    backlogs = backlogs_of(regular, upgrades, (forecasts, visits), now=now)
    for backlog in backlogs.values():
        if backlog.forecast.cycle is None and not any(any(hosts.values()) for hosts in backlog.pending.values()):
            continue  # no cycle opens before work is pending: nothing better known than the typical visit
        times = played_cycle(backlog, now=now)
        _forecast_played(forecasts[backlog.train.pk], times, visits.get(backlog.train.pk, {}), now)


def _forecast_played(
    forecast: TrainForecast,
    times: dict[int, tuple[dt.datetime, dt.datetime]],
    visits: dict[int, Visit],
    now: dt.datetime,
) -> None:
    """The forecast's domains at the played times, its cycle judged again. A done visit keeps its
    times; a stop added since the cycle opened has none (the next cycle visits it, as the play does)."""
    for domain in forecast.domains:
        visit = visits.get(domain.domain_id)
        if visit is not None and visit.state == VisitState.DONE:
            continue
        if domain.domain_id in times:
            domain.starts_at, domain.ends_at = times[domain.domain_id]
        elif forecast.cycle is not None:
            domain.starts_at = domain.ends_at = None
    forecast_judge(forecast, visits, now)

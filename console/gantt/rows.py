"""What the Gantt draws, read set-based: one query per kind of thing (domains, visits, operations
per domain, tasks of expanded hosts, opt-out windows, reservations) plus the trains' forecasts and
the per-upgrade forecasts (a fixed number of queries per pool), whatever the number of rows."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Max, Min, Q
from django.db.models.functions import Coalesce
from django.db.models.query import QuerySet
from django.urls import reverse

from console.gantt.params import GanttParams
from fleet.models import CapacityReservation, Host, MaintenanceDomain, OptOutWindow, Pool, ServicePlacement
from opsplanner import clock
from opsplanner.models import HostTask, TaskState
from trains.models import LIVE_TRAIN_STATES, Train, TrainStop, Upgrade, UpgradeState, Visit, VisitState
from trains.selectors_forecast import upgrades_forecasts
from trains.selectors_web import trains_forecasts

# Without a pool filter the whole fleet is drawn only while it is this small; beyond, the first pool.
MAX_ROWS_WITHOUT_POOL = 300


@dataclass
class Bar:
    start: dt.datetime
    end: dt.datetime
    css: str
    title: str
    lane: int = 0  # 0: visits and their forecast, 1: operations' host tasks
    href: str = ""


@dataclass
class Band:
    start: dt.datetime
    end: dt.datetime
    css: str
    title: str


@dataclass
class Mark:
    """A moment drawn as a marker on a row: when an upgrade is forecast to reach every host."""

    at: dt.datetime
    css: str
    title: str
    href: str = ""


@dataclass
class Row:
    key: str  # the SVG group's id is gantt-row-<key>
    level: int  # 0 pool, 1 domain, 2 host
    label: str
    pool_id: int
    href: str = ""
    domain_id: int | None = None
    host_id: int | None = None
    expanded: bool = False
    bars: list[Bar] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)


@dataclass
class Gantt:
    params: GanttParams
    now: dt.datetime
    rows: list[Row]
    pools: list[Pool]
    pool: Pool | None  # the pool shown when the page filters by one (or had to choose one)
    note: str = ""


def gantt_rows(params: GanttParams, *, pool_ids: set[int] | None = None) -> Gantt:
    """The rows for params; `pool_ids` narrows to those pools (a live push re-reads one pool)."""
    now = clock.now()
    pools = list(Pool.objects.order_by("name"))
    pool, note = _chosen_pool(params, pools)
    domains = _domains(params, pool)
    if pool_ids is not None:
        domains = domains.filter(pool_id__in=pool_ids)
    domain_list = list(domains.select_related("pool"))
    gantt = Gantt(params=params, now=now, rows=[], pools=pools, pool=pool, note=note)
    if params.host is not None:
        return _host_gantt(gantt)
    domain_ids = [d.pk for d in domain_list]
    expanded = {d for d in params.expand if d in set(domain_ids)}
    pool_rows: dict[int, Row] = {}
    domain_rows: dict[int, Row] = {}
    host_rows: dict[int, Row] = {}
    hosts_by_domain: dict[int, list[Row]] = defaultdict(list)
    if expanded:
        for host in (
            Host.objects.filter(domain_id__in=expanded)
            .order_by("hostname")
            .values("id", "hostname", "state", "domain_id", "pool_id")
        ):
            row = Row(
                key=f"host-{host['id']}",
                level=2,
                label=f"{host['hostname']} ({host['state'].replace('_', ' ')})",
                pool_id=host["pool_id"],
                href=reverse("fleet:host", args=[host["hostname"]]),
                domain_id=host["domain_id"],
                host_id=host["id"],
            )
            host_rows[host["id"]] = row
            hosts_by_domain[host["domain_id"]].append(row)
    for domain in domain_list:
        if domain.pool_id not in pool_rows:
            pool_rows[domain.pool_id] = Row(
                key=f"pool-{domain.pool_id}",
                level=0,
                label=f"pool {domain.pool.name}",
                pool_id=domain.pool_id,
                href=reverse("fleet:pool-hosts", args=[domain.pool.name]),
            )
            gantt.rows.append(pool_rows[domain.pool_id])
        row = Row(
            key=f"domain-{domain.pk}",
            level=1,
            label=domain.name,
            pool_id=domain.pool_id,
            domain_id=domain.pk,
            expanded=domain.pk in expanded,
        )
        domain_rows[domain.pk] = row
        gantt.rows.append(row)
        gantt.rows.extend(hosts_by_domain.get(domain.pk, []))
    if not domain_rows:
        return gantt
    _add_visits(gantt, domain_rows)
    _add_forecasts(gantt, domain_rows, pool_rows)
    _add_upgrade_forecasts(gantt, pool_rows)
    _add_operations(gantt, domain_rows)
    if host_rows:
        _add_host_tasks(gantt, host_rows)
    _add_optouts(gantt, domain_rows)
    _add_reservations(gantt, pool_rows)
    return gantt


def _chosen_pool(params: GanttParams, pools: list[Pool]) -> tuple[Pool | None, str]:
    if params.train is not None:
        train = Train.objects.filter(pk=params.train).select_related("pool").first()
        return (train.pool if train else None), "" if train else f"There is no train #{params.train}."
    if params.pool:
        chosen = next((p for p in pools if p.name == params.pool), None)
        return chosen, "" if chosen else f"There is no pool {params.pool!r}."
    if pools and MaintenanceDomain.objects.count() > MAX_ROWS_WITHOUT_POOL:
        return pools[0], f"The fleet has too many domains to draw at once: showing pool {pools[0].name}."
    return None, ""


def _domains(params: GanttParams, pool: Pool | None) -> QuerySet[MaintenanceDomain]:
    domains = MaintenanceDomain.objects.order_by("pool__name", "position", "name")
    if params.host is not None:
        return domains.filter(hosts__id=params.host)
    if (params.pool or params.train) and pool is None:
        return domains.none()
    if pool is not None:
        domains = domains.filter(pool=pool)
    if params.train is not None:
        domains = domains.filter(pk__in=TrainStop.objects.filter(train_id=params.train).values("domain_id"))
    if params.operation is not None:
        touched = HostTask.objects.filter(operation_id=params.operation).values("host__domain_id")
        domains = domains.filter(pk__in=touched)
    return domains


def _overlapping(start_field: str, end_field: str, params: GanttParams) -> Q:
    return Q(**{f"{start_field}__lt": params.end}) & (
        Q(**{f"{end_field}__isnull": True}) | Q(**{f"{end_field}__gt": params.start})
    )


def _component_matches(plan: dict, component: str) -> bool:
    return any(str(u.get("target", "")).split(" ")[0] == component for u in plan.get("upgrades", []))


def _add_visits(gantt: Gantt, domain_rows: dict[int, Row]) -> None:
    params = gantt.params
    visits = Visit.objects.filter(
        _overlapping("started_at", "ended_at", params), domain_id__in=list(domain_rows), started_at__isnull=False
    )
    if params.train is not None:
        visits = visits.filter(train_id=params.train)
    fields = ("id", "domain_id", "state", "started_at", "ended_at", "outcome", "plan", "train__name", "cycle__number")
    for visit in visits.values(*fields):
        if params.component and not _component_matches(visit["plan"], params.component):
            continue
        hosts = len(visit["plan"].get("hosts", []))
        targets = ", ".join(u.get("target", "") for u in visit["plan"].get("upgrades", [])) or "nothing to apply"
        title = (
            f"visit {visit['id']} of {visit['train__name']} (cycle {visit['cycle__number']}): "
            f"{visit['state']}, {hosts} hosts, {targets}" + (f"; {visit['outcome']}" if visit["outcome"] else "")
        )
        end = visit["ended_at"] or max(gantt.now, visit["started_at"])
        domain_rows[visit["domain_id"]].bars.append(
            Bar(visit["started_at"], end, f"visit visit-{visit['state']}", title)
        )


def _add_forecasts(gantt: Gantt, domain_rows: dict[int, Row], pool_rows: dict[int, Row]) -> None:
    """Upcoming visits, drawn ahead of now in their own style (the trains' forecasts)."""
    params = gantt.params
    if params.end <= gantt.now:
        return
    trains = Train.objects.filter(pool_id__in=list(pool_rows), state__in=LIVE_TRAIN_STATES)
    if params.train is not None:
        trains = trains.filter(pk=params.train)
    # Every train's forecast in one set-based read (a fixed number of queries, not per train).
    for forecast in trains_forecasts(list(trains.select_related("pool").order_by("pk")), now=gantt.now).values():
        train = forecast.train
        for domain in forecast.domains:
            row = domain_rows.get(domain.domain_id)
            if row is None or domain.starts_at is None or domain.ends_at is None:
                continue
            if domain.state in (VisitState.RUNNING, VisitState.DONE) or domain.ends_at <= params.start:
                continue
            skip = f"; waiting: {domain.skip_reason}" if domain.skip_reason else ""
            when = f"{domain.starts_at:%a %H:%M}-{domain.ends_at:%H:%M} UTC"
            title = f"forecast: {train.name} visits {domain.domain} {when}{skip}"
            css = f"forecast train-{train.state}" + (" skipped" if domain.skip_reason else "")
            row.bars.append(Bar(domain.starts_at, domain.ends_at, css, title))


def _add_upgrade_forecasts(gantt: Gantt, pool_rows: dict[int, Row]) -> None:
    """On each pool's row, where its active upgrades are forecast to reach every host (one set of
    forecast queries for all of them), marked late when that misses the upgrade's deadline."""
    params = gantt.params
    if params.end <= gantt.now:
        return
    upgrades = Upgrade.objects.filter(pool_id__in=list(pool_rows), state=UpgradeState.ACTIVE, emergency=False)
    if params.component:
        upgrades = upgrades.filter(component_version__component__name=params.component)
    listed = list(upgrades.select_related("pool", "component_version__component").order_by("created_at", "id"))
    if not listed:
        return
    forecasts = upgrades_forecasts(listed, now=gantt.now)
    for upgrade in listed:
        forecast = forecasts[upgrade.pk]
        if forecast.at is None or not params.start <= forecast.at <= params.end:
            continue
        pool_rows[upgrade.pool_id].marks.append(
            Mark(
                at=forecast.at,
                css="upgrade-forecast" + (" late" if forecast.deadline_met is False else ""),
                title=f"upgrade {upgrade.pk}, {upgrade.component_version}: {forecast.text}",
                href=reverse("trains:upgrade-detail", args=[upgrade.pk]),
            )
        )


def _task_css(states: dict[str, int]) -> str:
    """The most telling state of a group of tasks: failed, then in flight, then handed over, done."""
    for state in (TaskState.FAILED, TaskState.DRAINING, TaskState.RUNNING, TaskState.VERIFYING, TaskState.ADMITTED):
        if states.get(state):
            return state
    for state in (TaskState.HANDED_OVER, TaskState.DONE, TaskState.CANCELLED):
        if states.get(state):
            return state
    return TaskState.DONE


def _tasks(gantt: Gantt) -> QuerySet[HostTask]:
    params = gantt.params
    tasks = HostTask.objects.filter(_overlapping("admitted_at", "finished_at", params), admitted_at__isnull=False)
    if params.operation is not None:
        tasks = tasks.filter(operation_id=params.operation)
    if params.component:
        tasks = tasks.filter(operation__component_version__component__name=params.component)
    if params.train is not None:
        tasks = tasks.filter(operation__visit_link__visit__train_id=params.train)
    return tasks


def _add_operations(gantt: Gantt, domain_rows: dict[int, Row]) -> None:
    """Collapsed rows: one bar per operation per domain, from its first admission to its last end."""
    counts = {f"n_{state}": Count("id", filter=Q(state=state)) for state in TaskState.values}
    # Rows as plain mappings: the n_<state> counts are annotated under names made at run time.
    grouped: QuerySet[HostTask, Mapping[str, Any]] = (
        _tasks(gantt)
        .filter(host__domain_id__in=list(domain_rows))
        .values("host__domain_id", "operation_id", "operation__kind")
        .annotate(first=Min("admitted_at"), last=Max(Coalesce("finished_at", gantt.now)), **counts)
    )
    for group in grouped:
        states = {state: group[f"n_{state}"] for state in TaskState.values}
        summary = ", ".join(f"{n} {state.replace('_', ' ')}" for state, n in states.items() if n)
        title = f"operation #{group['operation_id']} {group['operation__kind']}: {summary}"
        css = f"task task-{_task_css(states)} kind-{group['operation__kind']}"
        domain_rows[group["host__domain_id"]].bars.append(Bar(group["first"], group["last"], css, title, lane=1))


def _add_host_tasks(gantt: Gantt, host_rows: dict[int, Row]) -> None:
    fields = (
        "id",
        "host_id",
        "state",
        "admitted_at",
        "finished_at",
        "operation_id",
        "operation__kind",
        "failure_reason",
    )
    for task in _tasks(gantt).filter(host_id__in=list(host_rows)).values(*fields):
        end = task["finished_at"] or max(gantt.now, task["admitted_at"])
        reason = f": {task['failure_reason']}" if task["failure_reason"] else ""
        what = f"operation #{task['operation_id']} {task['operation__kind']}"
        title = f"task #{task['id']} of {what}: {task['state']}{reason}"
        css = f"task task-{task['state']} kind-{task['operation__kind']}"
        host_rows[task["host_id"]].bars.append(Bar(task["admitted_at"], end, css, title, lane=1))


def _add_optouts(gantt: Gantt, domain_rows: dict[int, Row]) -> None:
    placements = (
        ServicePlacement.objects.filter(host__domain_id__in=list(domain_rows))
        .values_list("service_id", "host__domain_id")
        .distinct()
    )
    domains_of: dict[int, set[int]] = defaultdict(set)
    for service_id, domain_id in placements:
        domains_of[service_id].add(domain_id)
    if not domains_of:
        return
    windows = OptOutWindow.objects.filter(
        _overlapping("starts_at", "ends_at", gantt.params), service_id__in=list(domains_of), cancelled_at__isnull=True
    ).values("service_id", "service__name", "starts_at", "ends_at", "reason")
    for window in windows:
        title = f"opt-out of {window['service__name']}: {window['reason']}"
        for domain_id in domains_of[window["service_id"]]:
            domain_rows[domain_id].bands.append(Band(window["starts_at"], window["ends_at"], "optout", title))


def _add_reservations(gantt: Gantt, pool_rows: dict[int, Row]) -> None:
    reservations = CapacityReservation.objects.filter(
        _overlapping("starts_at", "ends_at", gantt.params), pool_id__in=list(pool_rows), cancelled_at__isnull=True
    ).values("pool_id", "service__name", "min_hosts_in_service", "starts_at", "ends_at", "reason")
    for reservation in reservations:
        title = (
            f"reservation for {reservation['service__name']}: at least {reservation['min_hosts_in_service']} "
            f"hosts in service ({reservation['reason']})"
        )
        pool_rows[reservation["pool_id"]].bands.append(
            Band(reservation["starts_at"], reservation["ends_at"], "reservation", title)
        )


def _host_gantt(gantt: Gantt) -> Gantt:
    """The host page's Gantt: one row for the host, its tasks over the window."""
    if gantt.params.host is None:
        return gantt
    host = Host.objects.filter(pk=gantt.params.host).values("id", "hostname", "state", "pool_id", "domain_id").first()
    if host is None:
        return gantt
    row = Row(
        key=f"host-{host['id']}",
        level=2,
        label=host["hostname"],
        pool_id=host["pool_id"],
        domain_id=host["domain_id"],
        host_id=host["id"],
    )
    gantt.rows.append(row)
    _add_visits(gantt, {host["domain_id"]: row})  # its domain's visits: when the train came by
    _add_host_tasks(gantt, {host["id"]: row})
    return gantt

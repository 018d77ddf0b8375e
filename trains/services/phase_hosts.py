"""Counting the hosts of a rollout phase, each once: the building blocks of the train tick's counts
(trains.services.upgrades: phase_failures, phase_rate_successes), as expressions on UpgradePhase
rows, and the hosts a what-if lane's phase carries from the live phase in force it copies
(CarriedHost, simulation/from_live_trains.py), counted with the phase's own tasks' hosts, each host
once, as the live tick counts them: a host that failed live and fails again in the lane is one
failure; one that failed live and succeeds in the lane stays one failure (and is no success of the
rate: live, a host that failed then caught up finished once, as a failure)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Generic, TypeVar

from django.db.models import Case, Exists, F, Func, IntegerField, OuterRef, QuerySet, Subquery, When
from django.db.models.expressions import Combinable, Expression
from django.db.models.functions import Coalesce

from opsplanner.models import HostTask
from trains.models import CarriedHost, UpgradePhase

T = TypeVar("T")

_COUNT_HOSTS = Func(F("host_id"), function="COUNT", template="%(function)s(DISTINCT %(expressions)s)")
_COUNT_ROWS = Func(function="COUNT", template="COUNT(*)", output_field=IntegerField())


def phase_row(name: str, depth: int) -> OuterRef:
    """A column of the UpgradePhase row `depth` queries out."""
    ref = OuterRef(name)
    for _ in range(depth - 1):
        ref = OuterRef(ref)
    return ref


def hosts_in(tasks: QuerySet[HostTask, Any]) -> Coalesce:
    """How many hosts `tasks` (a subquery) have, each once."""
    count = tasks.order_by().annotate(n=_COUNT_HOSTS).values("n")
    return Coalesce(Subquery(count, output_field=IntegerField()), 0)


def rows_in(rows: QuerySet[Any, Any]) -> Coalesce:
    """How many rows `rows` (a subquery) has."""
    count = rows.order_by().annotate(n=_COUNT_ROWS).values("n")
    return Coalesce(Subquery(count, output_field=IntegerField()), 0)


def carried_hosts(depth: int, **where: bool) -> QuerySet[CarriedHost, Any]:
    """The hosts a what-if lane's phase carries from its live copy (`where`: failed=...), for a
    subquery `depth` queries below UpgradePhase rows."""
    return CarriedHost.objects.filter(phase_id=phase_row("pk", depth), **where)


def not_carried(tasks: QuerySet[HostTask, Any], depth: int, **where: bool) -> QuerySet[HostTask, Any]:
    """`tasks` (a subquery `depth` queries below UpgradePhase rows) but those of the hosts the phase
    carries (`where`: failed=...): they count as carried."""
    return tasks.filter(~Exists(carried_hosts(depth + 1, **where).filter(host_id=OuterRef("host_id"))))


# Whether the queries built now count a what-if lane's carried hosts (live_hosts_carried): off on the
# live fleet, whose phases carry none, so its tick runs the counts as they were. Not a CASE on the
# phase's row: PostgreSQL plans every branch, and the capped success count took 10 ms to plan, not 3.7.
_CARRYING: ContextVar[bool] = ContextVar("live_hosts_carried", default=False)


@contextmanager
def live_hosts_carried(carrying: bool = True) -> Iterator[None]:
    """Within it, the phase counts built (and the compiled ones chosen: ByCarrying) count the hosts a
    what-if lane's phases carry from their live copies (UpgradePhase.carries_live_hosts): the
    simulator runs a lane built from the live fleet in it."""
    token = _CARRYING.set(carrying)
    try:
        yield
    finally:
        _CARRYING.reset(token)


def with_carried(own: Expression, carried: Combinable) -> Expression:
    """`own`, a count of the hosts of the phase's own tasks; within live_hosts_carried, `carried`,
    the count over both, each host once, for a phase that carries hosts (a column of the row decides,
    in a lane only)."""
    if not _CARRYING.get():
        return own
    return Case(When(carries_live_hosts=True, then=carried), default=own, output_field=IntegerField())


class ByCarrying(Generic[T]):
    """A compiled query (opsplanner/prepared.py, compiled once at its first use) in two variants, one
    per live_hosts_carried: each is first used, and so built, under its own setting."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._variants = (make(), make())

    def get(self) -> T:
        return self._variants[_CARRYING.get()]


def failed_hosts(failed: QuerySet[HostTask, Any]) -> Expression:
    """The hosts of the failed tasks `failed` (a subquery on UpgradePhase rows), each once, and for a
    what-if lane's phase those it carries as failed live, each once too: one that fails again in
    the lane is one failure, as live."""
    carried = rows_in(carried_hosts(1, failed=True))
    return with_carried(hosts_in(failed), hosts_in(not_carried(failed, 1, failed=True)) + carried)


class CountUpTo(Subquery):
    """COUNT(*) of a subquery's rows, up to `cap`: the scan stops at the cap (LIMIT), where a full
    count reads every row that matches."""

    template = "(SELECT COUNT(*) FROM (%(subquery)s LIMIT %(cap)s) AS counted)"

    def __init__(self, queryset: QuerySet[Any, Any], cap: int) -> None:
        super().__init__(queryset, output_field=IntegerField())
        self.cap = cap

    def as_sql(self, compiler: Any, connection: Any, template: str | None = None, **extra: Any) -> tuple[str, Any]:
        sql, params = super().as_sql(compiler, connection, template, cap="%s", **extra)
        return sql, (*params, self.cap)


def phases_hosts(phases: list[UpgradePhase], tasks: Callable[[], QuerySet[HostTask, Any]]) -> dict[int, set[int]]:
    """{upgrade: the hosts of `tasks` (a subquery on UpgradePhase rows, as the tick counts them)} in
    each of these phases (one an upgrade), in one query: the tasks of their upgrades whose phase's
    `tasks` has them. Not the hosts a what-if lane's phase carries (a live phase carries none)."""
    if not phases:
        return {}
    upgrade = "operation__visit_link__upgrade_id"
    has_it = UpgradePhase.objects.filter(pk__any=[p.pk for p in phases], upgrade_id=OuterRef(upgrade)).filter(
        Exists(tasks().filter(pk=OuterRef(OuterRef("pk"))))
    )
    rows = HostTask.objects.filter(**{f"{upgrade}__any": [p.upgrade_id for p in phases]}).filter(Exists(has_it))
    hosts: dict[int, set[int]] = defaultdict(set)
    for upgrade_id, host_id in rows.values_list(upgrade, "host_id").distinct():
        hosts[upgrade_id].add(host_id)
    return dict(hosts)

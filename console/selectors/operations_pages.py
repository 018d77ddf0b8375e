"""Reads of the operations pages: recent operations with their task counts, one operation with its
tasks (a page at a time: an operation can have thousands), its counts per state and its events.
A fixed number of queries whatever the number of tasks."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.core.paginator import EmptyPage, Page, PageNotAnInteger, Paginator
from django.db.models import Count, QuerySet

from console.filters import EventFilter
from fleet.models import Host, HostState, Pool
from opsplanner.models import Event, HostTask, Operation, TaskState

OPERATIONS_SHOWN = 50
TASKS_PER_PAGE = 100
EVENTS_SHOWN = 50


@dataclass
class OperationRow:
    operation: Operation
    counts: dict[str, int] = field(default_factory=dict)  # task state -> tasks

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def state_counts(self) -> list[tuple[str, str, int]]:
        """(state, label, tasks) for the states that have tasks, in lifecycle order."""
        return [(value, label, self.counts[value]) for value, label in TaskState.choices if self.counts.get(value)]


@dataclass
class OperationDetail:
    row: OperationRow
    pools: list[str]
    tasks: Page
    events: list[Event]
    task_state: str  # the tasks shown are in this state ("" for all)
    resubmissions: list[int]  # the operations asking for its superseded work again (its resubmission_of: the row's)


def _counts(operation_ids: list[int]) -> dict[int, dict[str, int]]:
    counts: dict[int, dict[str, int]] = {}
    rows = (
        HostTask.objects.filter(operation_id__any=operation_ids)
        .order_by()
        .values_list("operation_id", "state")
        .annotate(n=Count("id"))
    )
    for operation_id, state, n in rows:
        counts.setdefault(operation_id, {})[state] = n
    return counts


def all_operations() -> QuerySet[Operation]:
    """Every operation, for the list's FilterSet to narrow."""
    return Operation.objects.all()


def operation_state(*, operation_id: int) -> str | None:
    """The operation's state, or None if there is no such operation."""
    return Operation.objects.filter(pk=operation_id).values_list("state", flat=True).first()


def recent_operations(queryset: QuerySet[Operation], *, limit: int = OPERATIONS_SHOWN) -> list[OperationRow]:
    """The newest operations of `queryset` (already filtered), with their task counts: two queries."""
    operations = list(queryset.select_related("component_version__component").order_by("-created_at", "-id")[:limit])
    counts = _counts([operation.pk for operation in operations])
    return [OperationRow(operation=operation, counts=counts.get(operation.pk, {})) for operation in operations]


def operation_detail(*, operation_id: int, task_state: str = "", page: str = "1") -> OperationDetail | None:
    """One operation, a page of its tasks (optionally in one state, host and pool names joined), its
    counts per state, the pools it touches, its newest events and its resubmissions; None if there is
    no such operation."""
    operation = (
        Operation.objects.select_related("component_version__component", "requested_by").filter(pk=operation_id).first()
    )
    if operation is None:
        return None
    counts = _counts([operation.pk])
    pool_ids = HostTask.objects.filter(operation_id=operation.pk).order_by().values("pool_id").distinct()
    pools = list(Pool.objects.filter(pk__in=pool_ids).order_by("name").values_list("name", flat=True))
    tasks = HostTask.objects.filter(operation_id=operation.pk).select_related("host").order_by("id")
    if task_state:
        tasks = tasks.filter(state=task_state)
    total = (
        counts.get(operation.pk, {}).get(task_state, 0) if task_state else sum(counts.get(operation.pk, {}).values())
    )
    paginator = _KnownCountPaginator(tasks, TASKS_PER_PAGE, count=total)
    try:
        tasks_page = paginator.page(page)
    except PageNotAnInteger:
        tasks_page = paginator.page(1)
    except EmptyPage:
        tasks_page = paginator.page(paginator.num_pages)
    events = EventFilter({"operation": str(operation.pk)}, queryset=Event.objects.all()).qs.order_by("-id")
    return OperationDetail(
        row=OperationRow(operation=operation, counts=counts.get(operation.pk, {})),
        pools=pools,
        tasks=tasks_page,
        events=list(events[:EVENTS_SHOWN]),
        task_state=task_state,
        resubmissions=list(operation.resubmissions.order_by("pk").values_list("pk", flat=True)),
    )


class _KnownCountPaginator(Paginator):
    """A paginator told its count (from the counts per state already read): no COUNT(*) query."""

    def __init__(self, object_list: QuerySet[HostTask], per_page: int, *, count: int) -> None:
        super().__init__(object_list, per_page, allow_empty_first_page=True)
        self._known = count

    @property
    def count(self) -> int:
        return self._known


def escalated_host(*, hostname: str) -> Host | None:
    """The host if it is escalated (what the retry and release forms act on), else None."""
    return Host.objects.select_related("pool").filter(hostname=hostname, state=HostState.ESCALATED).first()

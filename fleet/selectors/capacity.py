"""How many hosts of each pool are in service, out for planned work and out broken."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Count, Q

from fleet.models import FAILURE_OUT_STATES, PLANNED_OUT_STATES, BufferSize, Host, HostState, Pool
from opsplanner.prepared import PreparedQuery


@dataclass
class PoolCapacity:
    pool: Pool
    by_state: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.by_state.values())

    @property
    def in_service(self) -> int:
        return self.by_state.get(HostState.IN_SERVICE, 0)

    @property
    def planned_out(self) -> int:
        return sum(self.by_state.get(state, 0) for state in PLANNED_OUT_STATES)

    @property
    def failure_out(self) -> int:
        return sum(self.by_state.get(state, 0) for state in FAILURE_OUT_STATES)

    @property
    def buffers(self) -> BufferSize:
        return self.pool.buffers_for(self.total)

    @property
    def state_counts(self) -> list[tuple[str, int]]:
        """(label, count) for every state, in lifecycle order, for display."""
        return [(label, self.by_state.get(value, 0)) for value, label in HostState.choices]


# Compiled once: the scheduler tick asks this of every pool it ticks (see opsplanner.prepared).
_COUNTS_BY_STATE = PreparedQuery(
    lambda *, pool_id: (
        Host.objects.filter(pool_id=pool_id)
        .order_by()
        .values("state")
        .annotate(count=Count("id"))
        .values_list("state", "count")
    ),
    pool_id=int,
)


def pool_capacity(pool: Pool) -> PoolCapacity:
    """One pool's host counts by state, in one query."""
    return PoolCapacity(pool=pool, by_state=dict(_COUNTS_BY_STATE.rows(pool_id=pool.pk)))


def pool_capacities(*, pool_id: int | None = None) -> list[PoolCapacity]:
    """Every pool (or one) with its host counts by state (the buffer usage of every pool): one query."""
    counts = {f"n_{state}": Count("hosts", filter=Q(hosts__state=state)) for state in HostState.values}
    capacities = []
    pools = Pool.objects.all() if pool_id is None else Pool.objects.filter(pk=pool_id)
    for pool in pools.annotate(**counts).order_by("name"):
        by_state = {state: getattr(pool, f"n_{state}") for state in HostState.values}
        capacities.append(PoolCapacity(pool=pool, by_state={k: v for k, v in by_state.items() if v}))
    return capacities

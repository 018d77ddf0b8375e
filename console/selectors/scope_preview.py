"""What a scope would cover before it is submitted: how many hosts, per pool, and what would make
them wait (another operation's lease, a host out of service, an opt-out window, a full buffer).

The preview asks the same questions admission asks, through the same reads: the scope resolver
(`opsplanner.scopes`), the tick's host-and-holder read, its opt-out read and `pool_headroom`. It
writes nothing: the tick context it builds only carries the pool and the time to those reads."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from django.core.exceptions import ValidationError

from fleet.models import Host, HostState, Pool
from opsplanner import clock
from opsplanner.models import OperationSource
from opsplanner.scopes import parse_scope, resolve_scope
from opsplanner.services.optouts import optouts_by_host
from opsplanner.services.tick.context import TickContext
from opsplanner.services.tick.headroom import Headroom, pool_headroom
from opsplanner.services.tick.queue_reads import HOSTS_AND_HOLDERS

SHOWN_REASONS = 5  # the largest holders and windows named per preview; the rest are counted


@dataclass(frozen=True)
class PoolPreview:
    """One pool's share of the scope and what would hold it back."""

    pool_id: int
    name: str
    hosts: int
    held: int  # hosts leased by another operation
    out_of_service: int  # hosts not in service (and not held): they wait until they are back
    opted_out: int  # hosts in service under an opt-out window (emergencies ignore them)
    headroom: int  # hosts of the pool that may go out for planned work now
    headroom_reason: str  # what binds when the headroom is used up
    ready: int  # hosts nothing above holds back
    over_headroom: int  # of the ready hosts, how many must wait for room in the buffer

    @property
    def may_start(self) -> int:
        return self.ready - self.over_headroom


@dataclass(frozen=True)
class ScopePreview:
    scope: str
    hosts: int = 0
    pools: list[PoolPreview] = field(default_factory=list)
    holders: list[tuple[int, int]] = field(default_factory=list)  # (operation id, hosts it holds), largest first
    optouts: list[tuple[str, int]] = field(default_factory=list)  # (window, hosts of the scope under it)
    error: str = ""  # the resolver's refusal, as it says it

    @property
    def may_start(self) -> int:
        return sum(pool.may_start for pool in self.pools)


def scope_preview(*, scope: str, needs_drain: bool = True, source: str = OperationSource.AD_HOC) -> ScopePreview:
    """Resolve `scope` and say, per pool, how many of its hosts could start now and why the others
    would wait. `needs_drain`: whether the operation drains its hosts (reboots and verifications do
    unless told not to; an upgrade as its component needs), so takes room in the planned buffer;
    `source`: an emergency ignores opt-out windows. A scope the resolver refuses gives a preview
    with its message and no hosts.
    Queries: the resolver's, then five, plus two per pool in the scope."""
    try:
        host_ids = resolve_scope(parse_scope(scope))
    except ValidationError as error:
        return ScopePreview(scope=scope, error=" ".join(error.messages))
    pool_of = dict(Host.objects.filter(pk__any=host_ids).values_list("id", "pool_id"))
    pools = {pool.pk: pool for pool in Pool.objects.filter(pk__in=set(pool_of.values()))}
    now = clock.now()
    states: dict[int, str] = {}
    holder_of: dict[int, int] = {}
    for host_id, state, operation_id in HOSTS_AND_HOLDERS.rows(ids=frozenset(host_ids)):
        states[host_id] = state
        if operation_id is not None:
            holder_of[host_id] = operation_id
    # Opt-out windows are read for the whole scope at once; emergencies do not honour them.
    windows = {} if source == OperationSource.EMERGENCY else optouts_by_host(now=now, host_ids=pool_of)
    per_pool: dict[int, Counter[str]] = {pool_id: Counter() for pool_id in pools}
    for host_id, pool_id in pool_of.items():
        per_pool[pool_id][_obstacle(host_id, states, holder_of, windows)] += 1
    previews = [
        _pool_preview(pools[pool_id], counts, needs_drain=needs_drain, now=now)
        for pool_id, counts in sorted(per_pool.items(), key=lambda item: pools[item[0]].name)
    ]
    return ScopePreview(
        scope=scope,
        hosts=len(pool_of),
        pools=previews,
        holders=Counter(holder_of.values()).most_common(SHOWN_REASONS),
        optouts=Counter(windows.values()).most_common(SHOWN_REASONS),
    )


def _obstacle(host_id: int, states: dict[int, str], holders: dict[int, int], windows: dict[int, str]) -> str:
    """The first thing admission would say of this host, in admission's order."""
    if host_id in holders:
        return "held"
    if states.get(host_id) != HostState.IN_SERVICE:
        return "out_of_service"
    if host_id in windows:
        return "opted_out"
    return "ready"


def _pool_preview(pool: Pool, counts: Counter[str], *, needs_drain: bool, now: object) -> PoolPreview:
    headroom = pool_headroom(TickContext(pool=pool, now=now))  # type: ignore[arg-type]
    room = max(headroom.remaining(), 0)
    ready = counts["ready"]
    return PoolPreview(
        pool_id=pool.pk,
        name=pool.name,
        hosts=sum(counts.values()),
        held=counts["held"],
        out_of_service=counts["out_of_service"],
        opted_out=counts["opted_out"],
        headroom=room,
        headroom_reason=_binding_limit(headroom, room) if needs_drain and ready >= room else "",
        ready=ready,
        over_headroom=max(ready - room, 0) if needs_drain else 0,
    )


def _binding_limit(headroom: Headroom, room: int) -> str:
    """What admission would say once `room` hosts went out: the limit that binds first."""
    used = replace(
        headroom,
        planned=headroom.planned - room,
        floor=headroom.floor - room,
        reservation=headroom.reservation - room,
        hard_floor=headroom.hard_floor - room,
    )
    return used.refusal()[1]

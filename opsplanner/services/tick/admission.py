"""Tick step 5: admit pending host tasks up to the pool's headroom, in (priority, age) order.

headroom = min(planned buffer - planned out, in service - floor, in service - active reservation).
Hosts held by a lease, not in service, under an opt-out window or already claimed by an earlier
task in the order are skipped (a broken host's repair claims its host first and waits for no
window); gang operations are admitted whole or not at all, and one that lacks only room keeps the
room left from the work behind it (it would starve otherwise). Every task left pending records why,
and the reason only changes (is written) when it changes. Only the head of the queue is examined
task by task (a held operation's tasks take no place in it); when room is left after it and some of
it waits for something else than room (an opt-out window, a host out or claimed), the work behind
is read on, a few growing pages at most (_read_on). The tasks behind what was examined say that
they wait their turn (or that their operation is held), set-based, in words that do not change as
the queue moves.
An upgrade with a newer target of its component pending for the same host waits for it, and ends
superseded once the newer one is applied: in the drain it is admitted to (at the handover after
it), as it finishes in place, or in the tick it is admitted if the host runs it already; not
before: were the newer one cancelled, failed or withdrawn before the host has it, the host would
get neither. An admitted upgrade whose host already runs its target (or newer) finishes
without a drain, and one older than what its host got after it was created (while it was held,
say) ends superseded (supersede.py), after which what waits is judged again in the same tick.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db.models import F

from fleet.models import HostState
from opsplanner.models import (
    OperationSource,
    TaskState,
    WaitingCode,
    WorkKind,
)
from opsplanner.services.optouts import optouts_by_host
from opsplanner.services.tick import supersede
from opsplanner.services.tick.checks import incompatible_targets
from opsplanner.services.tick.context import TaskRef, TickContext, task_refs, task_refs_from_rows
from opsplanner.services.tick.headroom import Headroom, pool_headroom
from opsplanner.services.tick.queue_reads import (
    ANY_PENDING,
    HELD_BEYOND,
    HOSTS_AND_HOLDERS,
    IN_PLACE_OR_HELD_OPERATIONS,
    QUEUED_BEYOND,
    QUEUED_BEYOND_BUT_HELD,
    WAITING_REASON,
    pending_queue,
    queue_after,
    queue_head,
    queue_head_unheld,
    queue_reason,
)

HORIZON_MIN = 100
HORIZON_PER_FREE_HOST = 2
READ_ON_PAGES = 3  # pages read on at most behind a head blocked by something else than room (_read_on)
ADMISSION_PASSES = 3  # at most a tick: a pass judges again only after one where upgrades had nothing to do


@dataclass
class _QueueHead:
    """The tasks admission examines this tick."""

    candidates: dict[int, TaskRef]  # by id: the head, tasks that need no drain, and whole gangs
    order: list[TaskRef]  # the head and the in-place tasks in (priority, age) order
    held: set[int]  # open operations on hold, read only when the head is full
    full: bool  # the head reached the horizon: tasks may wait behind it
    last: tuple[int, int] | None = None  # (priority, id) of the last task read in queue order, if full
    # Taken out of `order`: {pending upgrade: the newer target of its component pending for its host}.
    superseded: dict[int, TaskRef] = field(default_factory=dict)


@dataclass
class _Obstacles:
    """What may keep a candidate from its host, read once for all candidates."""

    host_states: dict[int, str]
    holders: dict[int, int]  # host -> the operation holding its lease
    optouts: dict[int, str]
    incompatible: dict[int, str]  # task -> why its target is incompatible
    repairs_broken: set[int]  # repairs of hosts that broke in service: no drain, no buffer
    claimed: dict[int, TaskRef] = field(default_factory=dict)  # host -> the task first in line for it this tick

    def of(self, task: TaskRef) -> tuple[str, str] | None:
        """Why the task cannot have its host now, or None."""
        first = self.claimed.get(task.host_id)
        if first is not None and first.id != task.id:
            return WaitingCode.QUEUED, f"queued behind operation #{first.operation_id} on this host"
        if task.host_id in self.holders:
            return WaitingCode.HOST_HELD, f"host held by operation #{self.holders[task.host_id]}"
        state = self.host_states.get(task.host_id)
        if state != HostState.IN_SERVICE and task.id not in self.repairs_broken:
            return WaitingCode.HOST_STATE, f"host is {state}"
        # A broken host serves nothing the window protects: its repair does not wait for the window.
        if (
            task.host_id in self.optouts
            and task.source != OperationSource.EMERGENCY
            and task.id not in self.repairs_broken
        ):
            return WaitingCode.OPTOUT, self.optouts[task.host_id]
        if task.id in self.incompatible:
            return WaitingCode.INCOMPATIBLE, self.incompatible[task.id]
        return None

    def add(self, more: _Obstacles) -> None:
        """What keeps more candidates (a page read on) from their hosts. A broken host's repair
        claims its host first still: whatever claimed it before could not take a failed host."""
        for host_id, task in more.claimed.items():
            first = self.claimed.get(host_id)
            if first is None or first.id not in self.repairs_broken:
                self.claimed[host_id] = task
        self.host_states.update(more.host_states)
        self.holders.update(more.holders)
        self.optouts.update(more.optouts)
        self.incompatible.update(more.incompatible)
        self.repairs_broken |= more.repairs_broken


@dataclass
class _Decisions:
    admitted: list[TaskRef] = field(default_factory=list)
    waiting: dict[int, tuple[str, str]] = field(default_factory=dict)  # task -> (code, reason)


def admit(ctx: TickContext, *, budget: int) -> None:
    """Admit what fits. Only the head of the queue is examined: twice the free headroom (at
    least HORIZON_MIN tasks), plus tasks that need no drain. Tasks further back are not examined
    one by one: they get a reason true of all of them (see _write_waiting_beyond).
    An upgrade whose host already runs its target is known only once admitted, and finishes then:
    the host it claimed and the room it took are free again, so what waits is judged again (else it
    would wait a tick, saying it queues behind an operation that has finished)."""
    for _ in range(ADMISSION_PASSES):
        waiting, again = _admit_pass(ctx, budget=budget)
        if not again:
            break
    ctx.counts.waiting += waiting


def _admit_pass(ctx: TickContext, *, budget: int) -> tuple[int, bool]:
    """(how many examined tasks wait, whether to judge again: tasks finished with nothing to do
    while others wait)."""
    if not ANY_PENDING.rows(pool_id=ctx.pool.pk):  # most ticks of a busy pool: its work is all under way
        return 0, False
    headroom = pool_headroom(ctx)
    horizon = min(budget, max(HORIZON_PER_FREE_HOST * max(headroom.remaining(), 0), HORIZON_MIN))
    head = _examine_head(ctx, horizon=horizon)
    if not head.candidates:
        return 0, False
    obstacles = _read_obstacles(ctx, head.candidates)
    _skip_superseded(head, obstacles)
    decisions = _judge_queue(head, obstacles, headroom)
    _read_on(ctx, head, obstacles, headroom, decisions, size=horizon, budget=budget)
    settled = supersede.finish_admitted_with_nothing_to_do(ctx, decisions.admitted)
    admitted = settled.taking
    _settle_superseded(ctx, head, decisions, taking={task.id for task in admitted}, overtaken=settled.overtaken)
    current = {task_id: task.waiting_reason for task_id, task in head.candidates.items()}
    _write_waiting(ctx, decisions.waiting, current)
    if head.full:
        _write_waiting_beyond(ctx, examined=frozenset(head.candidates), held=head.held)
    broken = obstacles.repairs_broken
    _admit(ctx, [t for t in admitted if t.id not in broken])
    _admit_broken_repairs(ctx, [t for t in admitted if t.id in broken])
    # Judged again at once when a task finished without taking its host while others wait, or one
    # left behind an overtaken task (not waiting: _settle_superseded) may now take it (helper-54).
    left_behind = any(newer.id in settled.overtaken for newer in head.superseded.values())
    return len(decisions.waiting), len(admitted) < len(decisions.admitted) and (bool(decisions.waiting) or left_behind)


def _examine_head(ctx: TickContext, *, horizon: int) -> _QueueHead:
    """The first `horizon` pending tasks; when more wait behind them, also every task that needs
    no drain (work that takes no capacity is never stuck behind work that does); and every gang
    met, whole (a gang is judged whole, even the part beyond the budget)."""
    pending = pending_queue(ctx.pool.pk)
    candidates = task_refs_from_rows(queue_head(horizon).rows(pool_id=ctx.pool.pk))
    held: set[int] = set()
    full = len(candidates) == horizon
    last = _last(candidates) if full else None
    if full:
        special = IN_PLACE_OR_HELD_OPERATIONS.rows()
        in_place = [operation_id for operation_id, needs_drain, hold in special if not needs_drain and not hold]
        held = {operation_id for operation_id, _, hold in special if hold}
        if held and any(task.operation_id in held for task in candidates.values()):
            # A held operation claims no host, nor a place at the head: however many tasks it holds,
            # the work behind them is examined (they say they are held with the tasks beyond the head).
            unheld = queue_head_unheld(horizon).rows(pool_id=ctx.pool.pk, held=frozenset(held))
            if unheld:
                candidates = task_refs_from_rows(unheld)
            last = _last(candidates) if len(unheld) == horizon else None  # else no unheld task is behind
        if in_place:
            for task in task_refs(pending.filter(operation_id__any=in_place)[:horizon]).values():
                candidates.setdefault(task.id, task)
    if not candidates:
        return _QueueHead(candidates={}, order=[], held=held, full=full)
    order = sorted(candidates.values(), key=lambda t: (-t.priority, t.queued_at, t.id))
    _add_gangs(ctx, candidates, order)
    return _QueueHead(candidates=candidates, order=order, held=held, full=full, last=last)


def _last(tasks: dict[int, TaskRef]) -> tuple[int, int]:
    """(priority, id) of the last of the tasks read, in the order read."""
    task = next(reversed(tasks.values()))
    return task.priority, task.id


def _add_gangs(ctx: TickContext, candidates: dict[int, TaskRef], order: list[TaskRef]) -> None:
    """Every gang met in `order`, whole (a gang is judged whole, even the part beyond the budget)."""
    gang_ops = {t.operation_id for t in order if t.gang}
    if gang_ops:
        for task in task_refs(pending_queue(ctx.pool.pk).filter(operation_id__any=gang_ops)).values():
            candidates.setdefault(task.id, task)


def _read_on(
    ctx: TickContext,
    head: _QueueHead,
    obstacles: _Obstacles,
    headroom: Headroom,
    decisions: _Decisions,
    *,
    size: int,
    budget: int,
) -> None:
    """A full head after which room is left, some of it waiting for something else than room (an
    opt-out window, a host escalated or claimed, a target incompatible: for as long as that lasts),
    would keep every task behind it waiting its turn as long: the queue is read on behind the head's
    last task, page after page, each twice the last (READ_ON_PAGES at most, the budget in all), and
    judged with what is left of the room, while some is. The pages join the head (`head`)."""
    for _ in range(READ_ON_PAGES):
        if head.last is None or not decisions.waiting or headroom.remaining() <= 0:
            return
        size = min(2 * size, budget - len(head.candidates))
        if size <= 0:
            return
        page = _next_page(ctx, head, size)
        if not page.order:  # all examined already (tasks that need no drain): read on
            continue
        obstacles.add(_read_obstacles(ctx, page.candidates))
        _skip_superseded(page, obstacles)
        _judge_queue(page, obstacles, headroom, decisions)
        head.candidates.update(page.candidates)
        head.order.extend(page.order)
        head.superseded.update(page.superseded)


def _next_page(ctx: TickContext, head: _QueueHead, size: int) -> _QueueHead:
    """The `size` pending tasks behind the head's last one (not held), but those examined already
    (tasks that need no drain, gangs' members), and the whole of every gang met."""
    priority, after = head.last or (0, 0)
    if head.held:
        query = queue_after(size, unheld=True)
        rows = query.rows(pool_id=ctx.pool.pk, priority=priority, after=after, held=frozenset(head.held))
    else:
        rows = queue_after(size, unheld=False).rows(pool_id=ctx.pool.pk, priority=priority, after=after)
    read = task_refs_from_rows(rows)
    head.last = _last(read) if len(rows) == size else None
    order = [task for task_id, task in read.items() if task_id not in head.candidates]  # in queue order
    candidates = {task.id: task for task in order}
    _add_gangs(ctx, candidates, order)
    return _QueueHead(candidates=candidates, order=order, held=head.held, full=True)


def _read_obstacles(ctx: TickContext, candidates: dict[int, TaskRef]) -> _Obstacles:
    host_ids = {t.host_id for t in candidates.values()}
    host_states: dict[int, str] = {}
    holders: dict[int, int] = {}
    for host_id, state, operation_id in HOSTS_AND_HOLDERS.rows(ids=host_ids):
        host_states[host_id] = state
        if operation_id is not None:
            holders[host_id] = operation_id
    # A repair of a host that broke in service takes it as it is: failed, out of the failure buffer.
    repairs_broken = {
        t.id
        for t in candidates.values()
        if t.source == OperationSource.REPAIR and host_states.get(t.host_id) == HostState.FAILED
    }
    # Its repair is first in line for the host, whatever else waits for it at the same priority:
    # nothing else can take a failed host, so anything first in line would wait for the repair forever.
    claimed: dict[int, TaskRef] = {}
    for task in sorted((candidates[i] for i in repairs_broken), key=lambda t: (t.queued_at, t.id)):
        claimed.setdefault(task.host_id, task)
    return _Obstacles(
        host_states=host_states,
        holders=holders,
        optouts=optouts_by_host(now=ctx.now, host_ids=host_ids),
        incompatible=incompatible_targets(candidates.values()),
        repairs_broken=repairs_broken,
        claimed=claimed,
    )


def _may_replace(obstacles: _Obstacles) -> Callable[[TaskRef, TaskRef], bool]:
    """Whether a newer pending upgrade may take an older one's place at admission: it would be
    admitted as soon (no later in the queue order, no less privileged: an emergency is not replaced
    by routine work that waits for opt-out windows or the planned buffer), and it can be admitted
    at all (not held, not a gang's, its target not refused). Otherwise both go, in order, in one
    drain (the handover skips the older one if the newer went first), or the older one waits for
    its host and is superseded once the newer one is applied there (a gang's member too:
    returning.successors, supersede_older_than_in_place)."""

    def may_replace(older: TaskRef, newer: TaskRef) -> bool:
        return (
            not (older.gang or older.hold_reason or newer.gang or newer.hold_reason)
            and newer.id not in obstacles.incompatible
            and newer.priority >= older.priority
            and (older.source != OperationSource.EMERGENCY or newer.source == OperationSource.EMERGENCY)
            and (newer.override_buffers or not older.override_buffers)
        )

    return may_replace


def _skip_superseded(head: _QueueHead, obstacles: _Obstacles) -> None:
    """A pending upgrade with a newer target of its component pending for the same host (one that
    may take its place) is not judged: the newer one is, in its place (see _settle_superseded)."""
    newer = supersede.newer_pending(head.order, may_replace=_may_replace(obstacles))
    if newer:
        head.superseded.update(newer)
        head.order = [task for task in head.order if task.id not in newer]


def _settle_superseded(
    ctx: TickContext, head: _QueueHead, decisions: _Decisions, *, taking: set[int], overtaken: set[int]
) -> None:
    """An upgrade whose newer target was admitted to take the host (`taking`: to drain it, or to
    install in place) waits for the host that one holds, and ends superseded once it is applied
    (at the handover after it, or as it finishes in place: returning.supersede_older_than_in_place);
    one whose newer target still waits waits for it. Pending, both: were the newer one cancelled,
    failed or withdrawn before the host has it, the host would otherwise get neither. One whose
    newer target had nothing to do (the host runs it already) ends superseded now; one whose newer
    target was overtaken (`overtaken`: the host got newer still, so that one ended superseded) is left
    as it was, judged again next tick on its own (a downgrade asked since the host got it runs)."""
    admitted = {task.id for task in decisions.admitted}
    taken = {older: newer for older, newer in head.superseded.items() if newer.id in admitted - taking - overtaken}
    supersede.finish_superseded(ctx, head.candidates, taken)
    for older, newer in head.superseded.items():
        if newer.id in taking:  # in the words of the next ticks' judgement, which then write nothing
            decisions.waiting[older] = (WaitingCode.HOST_HELD, f"host held by operation #{newer.operation_id}")
    waiting = {older: newer for older, newer in head.superseded.items() if newer.id not in admitted}
    for task_id, reason in supersede.waiting_for_newer(waiting).items():
        decisions.waiting[task_id] = (WaitingCode.NEWER_PENDING, reason)


def _judge_queue(
    head: _QueueHead, obstacles: _Obstacles, headroom: Headroom, decisions: _Decisions | None = None
) -> _Decisions:
    """Each task in order is admitted (taking headroom if it drains) or told why it waits."""
    decisions = decisions if decisions is not None else _Decisions()
    gangs = _group_gangs(head.candidates.values())
    judged_gangs: set[int] = set()
    for task in head.order:
        if task.hold_reason:  # a held operation claims no host: the work behind it goes on
            decisions.waiting[task.id] = (WaitingCode.HELD, f"held: {task.hold_reason}")
        elif task.gang:
            if task.operation_id not in judged_gangs:
                judged_gangs.add(task.operation_id)
                _judge_gang(gangs[task.operation_id], task.override_buffers, obstacles, headroom, decisions)
        else:
            _judge_task(task, obstacles, headroom, decisions)
    return decisions


def _judge_gang(
    members: list[TaskRef], emergency: bool, obstacles: _Obstacles, headroom: Headroom, decisions: _Decisions
) -> None:
    """A gang is admitted whole or not at all; every member waits for the first obstacle met."""
    for member in members:
        obstacles.claimed.setdefault(member.host_id, member)
    blocked = [(member, obstacle) for member in members if (obstacle := obstacles.of(member)) is not None]
    need = sum(1 for m in members if m.needs_drain)
    if blocked:
        first, (_, why) = blocked[0]
        reason = f"gang of {len(members)} hosts waits: {why} (host {first.host_id})"
    elif need > headroom.remaining(emergency=emergency):
        room = max(headroom.remaining(emergency=emergency), 0)
        reason = f"gang needs {need} hosts at once; {room} may go out now"
        if need <= room + headroom.out:  # it fits once the hosts out for planned work are back
            operation_id = members[0].operation_id
            headroom.keep_for_gang(
                f"the room left is kept for gang operation #{operation_id}, ahead in the queue ({need} hosts at once)",
                emergency=emergency,
            )
    else:
        for member in members:
            if member.needs_drain:
                headroom.take()
        decisions.admitted.extend(members)
        return
    for member in members:
        decisions.waiting[member.id] = (WaitingCode.GANG, reason[:300])


def _judge_task(task: TaskRef, obstacles: _Obstacles, headroom: Headroom, decisions: _Decisions) -> None:
    obstacles.claimed.setdefault(task.host_id, task)
    why = obstacles.of(task)
    drains = task.needs_drain and task.id not in obstacles.repairs_broken
    if why is None and drains and headroom.remaining(emergency=task.override_buffers) <= 0:
        why = headroom.refusal(emergency=task.override_buffers)
    if why is not None:
        decisions.waiting[task.id] = why
        return
    if drains:
        headroom.take()
    decisions.admitted.append(task)


def _group_gangs(tasks: Iterable[TaskRef]) -> dict[int, list[TaskRef]]:
    groups: dict[int, list[TaskRef]] = defaultdict(list)
    for task in tasks:
        if task.gang:
            groups[task.operation_id].append(task)
    return groups


def _write_waiting(ctx: TickContext, waiting: dict[int, tuple[str, str]], current: dict[int, str]) -> None:
    """Record why tasks wait, writing only reasons that changed, one UPDATE per distinct reason."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for task_id, (code, reason) in waiting.items():
        if current.get(task_id) != reason[:300]:
            groups[(code, reason[:300])].append(task_id)
    for (code, reason), task_ids in groups.items():
        WAITING_REASON.count(ids=set(task_ids), code=code, reason=reason)
    ctx.counts.waiting_reasons_changed += sum(len(ids) for ids in groups.values())


def _write_waiting_beyond(ctx: TickContext, *, examined: frozenset[int], held: set[int]) -> None:
    """Tasks behind the examined head of the queue say why they wait too: held, if their operation
    is, else that their turn has not come (queue_reason). Neither changes as the queue moves, so a
    quiet tick rewrites no row: one UPDATE per reason, set-based, guarded to rows whose reason
    differs, which also corrects a task examined once that has since fallen behind."""
    code, reason = queue_reason(ctx.pool.name)
    if held:
        ids = frozenset(held)
        changed = QUEUED_BEYOND_BUT_HELD.count(
            pool_id=ctx.pool.pk, examined=examined, code=code, reason=reason, held=ids
        )
        changed += HELD_BEYOND.count(pool_id=ctx.pool.pk, examined=examined, held=ids)
    else:
        changed = QUEUED_BEYOND.count(pool_id=ctx.pool.pk, examined=examined, code=code, reason=reason)
    ctx.counts.waiting_reasons_changed += changed


def _admit(ctx: TickContext, tasks: list[TaskRef]) -> None:
    """Lease, then one guarded UPDATE per path: pending → draining (opening its drain) or, with no
    drain needed, pending → running; each through admitted, which both events record."""
    if not tasks:
        return
    ctx.grant_leases(tasks, reason="admitted")
    drained = [t for t in tasks if t.needs_drain]
    in_place = [t for t in tasks if not t.needs_drain]
    admitted: dict[str, Any] = {"admitted_at": ctx.now, "waiting_code": "", "waiting_reason": ""}
    # A drained task opens a drain; tasks handed over later in that drain share its key.
    ctx.move_tasks(
        drained,
        expected=TaskState.PENDING,
        via=TaskState.ADMITTED,
        new=TaskState.DRAINING,
        drain_key=F("id"),
        **admitted,
    )
    for task in drained:
        task.drain_key = task.id
    ctx.move_hosts(
        [t.host_id for t in drained],
        expected=HostState.IN_SERVICE,
        new=HostState.DRAINING,
        reason="admitted: draining for planned work",
    )
    for task in drained:
        ctx.add_item(task, kind=WorkKind.DRAIN, adapter=task.drainer, deadline_s=task.drain_timeout_s)
    ctx.move_tasks(
        in_place,
        expected=TaskState.PENDING,
        via=TaskState.ADMITTED,
        new=TaskState.RUNNING,
        reason="no drain needed",
        **admitted,
    )
    ctx.add_execute_items(in_place)


def _admit_broken_repairs(ctx: TickContext, tasks: list[TaskRef]) -> None:
    """A host that broke while in service: no drain (it is already out), failed → repair, and its
    repair opens a drain so verification and the return follow as after any drain."""
    if not tasks:
        return
    ctx.grant_leases(tasks, reason="admitted: repairing a broken host")
    ctx.move_tasks(
        tasks,
        expected=TaskState.PENDING,
        via=TaskState.ADMITTED,
        new=TaskState.RUNNING,
        reason="repairing a host that broke in service",
        drain_key=F("id"),
        admitted_at=ctx.now,
        waiting_code="",
        waiting_reason="",
    )
    for task in tasks:
        task.drain_key = task.id
    ctx.move_hosts([t.host_id for t in tasks], expected=HostState.FAILED, new=HostState.REPAIR, reason="repair started")
    ctx.add_execute_items(tasks)
    ctx.counts.repairs_started += len(tasks)

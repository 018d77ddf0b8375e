"""The policies a simulation compares, each driving the real services in virtual time.

- trains: OpsPlanner's own maintenance trains (one train per pool visits a domain at a time and
  applies every pending upgrade in one drain);
- rolling: how node reboot and upgrade controllers work today: each upgrade rolls through the pool
  on its own, a fixed number of hosts at a time, one drain per upgrade; upgrades queue per pool;
- lockstep: each upgrade drains the whole pool at once (a gang over every host that needs it).
The peers submit ordinary operations; the core admits, drains, verifies and returns them as it
does for any other work, so all three are measured by the same code.
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet

from fleet.models import Host, HostState, InstalledVersion, Pool
from opsplanner import clock
from opsplanner.models import OPEN_TASK_STATES, HostTask, OperationKind
from opsplanner.prepared import IDS, PreparedQuery
from opsplanner.scopes import parse_scope, resolve_scope
from opsplanner.services.operations import operation_submit
from simulation.config import LIVE_TRAIN_STATE, Arrival, SimulationConfig
from simulation.from_live_trains import carried_phase_write, carried_soaks_graduate, open_cycle_copy
from simulation.scenarios import simulated_hardware_apply, upgrade_duration_register
from simulation.world import World
from trains.limits import MAX_CYCLE_SLO_S

if TYPE_CHECKING:
    from trains.models import Train, Upgrade


def _ticking_trains(**where: Any) -> QuerySet[Any, tuple[int, int]]:
    from trains.models import Train, TrainState

    states = [TrainState.RUNNING, TrainState.PAUSED, TrainState.AUTOSTOPPED]
    return Train.objects.filter(state__in=states, **where).order_by("pk").values_list("pk", "pool_id")


# The trains a policy step ticks, asked at nearly every instant: compiled once.
_TICKING_TRAINS = PreparedQuery(_ticking_trains)
_TICKING_TRAINS_OF = PreparedQuery(lambda *, ids: _ticking_trains(pool_id__any=ids), ids=IDS)


def _resuming_trains() -> QuerySet[Any, tuple[dt.datetime | None, int | None]]:
    """The autostopped trains counting down to resuming on their own: since when, and for how long."""
    from trains.models import Train, TrainState

    return (
        Train.objects.filter(
            state=TrainState.AUTOSTOPPED, recovered_since__isnull=False, auto_resume_after_s__isnull=False
        )
        .order_by()
        .values_list("recovered_since", "auto_resume_after_s")
    )


_RESUMING_TRAINS = PreparedQuery(_resuming_trains)

ACTOR = "simulator"


@dataclass
class Rollout:
    """One upgrade in one pool: when it arrived and when every host ran it."""

    pool: str
    component: str
    version: str
    arrived: dt.datetime
    finished: dt.datetime | None = None
    outcome: str = ""
    # What the product promised when the upgrade first appeared (trains only: the first forecast the
    # upgrade keeps, trains/services/upgrade_forecast.py): when it would reach every host, and the
    # forecast's code (trains.selectors_forecast.ForecastCode).
    forecast_at: dt.datetime | None = None
    forecast_code: str = ""
    # The hosts it covers when narrower than its pool (a live upgrade's scope), as its scope named
    # them when it arrived: reach is measured against these.
    host_ids: list[int] | None = None


class Policy:
    name = ""
    label = ""

    def __init__(self, config: SimulationConfig, world: World) -> None:
        self.config = config
        self.world = world

    def setup(self) -> None:
        """Called once, before virtual time starts: the scenario's simulated hardware."""
        simulated_hardware_apply(self.config)

    def arrive(self, arrival: Arrival) -> None:
        raise NotImplementedError

    def upgrade_known(self, arrival: Arrival) -> int | None:
        """The simulated executor learns how long this upgrade takes on a host (a live upgrade's own
        duration, else the scenario's spread: upgrade_duration_register); that time, as the release
        would announce it (None: neither, the default estimate). Without it, the execution deadline
        (three times the estimate) fails every long upgrade."""
        announced = arrival.upgrade.get("duration_s")
        return upgrade_duration_register(self.config, arrival.component, arrival.version, announced)

    def step(self, pool_ids: set[int] | None) -> set[int]:
        """Act for these pools (None: all) at the current instant; the pools where it changed something."""
        return set()

    def wakes_at(self) -> dt.datetime | None:
        """When it has something to do on time alone, nothing else happening (None: nothing)."""
        return None

    def rollouts(self) -> list[Rollout]:
        raise NotImplementedError


def _live_train_create(pool: Pool, spec: dict[str, Any]) -> None:
    """A live train as it is there, with an SLO its stops may no longer meet: racks the fleet onboarded
    became its stops (trains/services/cycles.py, which alerts), where train_create refuses such an SLO
    from an operator. The lane forecasts the cycles it then runs, rather than fail the what-if. `spec`
    is from_live.live_train_spec: train_create's arguments and the train's live state."""
    from trains.models import Train
    from trains.services.trains import train_create

    live = {key: spec.get(key, default) for key, default in LIVE_TRAIN_STATE.items()}
    created = {key: value for key, value in spec.items() if key not in LIVE_TRAIN_STATE}
    resume = {"auto_resume_after_s": live["auto_resume_after_s"]}  # as live: None never resumes on its own
    try:
        train = train_create(pool=pool, **resume, actor=ACTOR, **created)
    except ValidationError as refused:
        if set(refused.message_dict) != {"cycle_slo_s"}:
            raise
        train = train_create(pool=pool, **resume, actor=ACTOR, **{**created, "cycle_slo_s": MAX_CYCLE_SLO_S})
        Train.objects.filter(pk=train.pk).update(cycle_slo_s=created["cycle_slo_s"])
    open_cycle_copy(train, live["open_cycle"])
    _live_train_stop(train, live)


def _live_train_stop(train: Train, live: dict[str, Any]) -> None:
    """A train paused or autostopped live starts the forecast so: paused, it stays paused (no one
    resumes it in the lane); autostopped, the train tick resumes it as it would live. Its event is not
    `train.autostopped`, which the measures count as an autostop of the forecast."""
    from trains.models import STOPPED_TRAIN_STATES, Train, TrainState
    from trains.services.trains import train_set_state

    if live["state"] not in STOPPED_TRAIN_STATES:
        return
    reason = f"{live['state']} on the live fleet: {live['state_reason'] or 'no reason given'}"
    train_set_state(
        train=train, expected={TrainState.RUNNING}, new=live["state"], reason=reason, actor=ACTOR,
        kind="train.state_copied",
    )  # fmt: skip
    if live["recovered_since"] and live["state"] == TrainState.AUTOSTOPPED:
        # The live countdown to its automatic resumption is under way: the lane's goes on from it.
        recovered = dt.datetime.fromisoformat(live["recovered_since"])
        Train.objects.filter(pk=train.pk).update(recovered_since=recovered)


class TrainsPolicy(Policy):
    name = "trains"
    label = "maintenance trains"
    pace = "domain"  # domain-synchronous; TrainsSlidingPolicy slides (a live train's own pace is not kept)

    def __init__(self, config: SimulationConfig, world: World) -> None:
        super().__init__(config, world)
        # upgrade id -> the hosts its scope named on arrival (scoped upgrades only), as the rolling
        # policy keeps them: a selector like 'hosts running C below V' names fewer hosts as the
        # upgrade reaches them, so resolving it at the end would measure reach against the laggards.
        self.scopes: dict[int, list[int]] = {}
        # upgrade id -> its pool and when its first phase graduates: a live upgrade whose phase in force
        # had its evidence and still soaked (from_live_trains.carried_soaks_graduate).
        self.soaking: dict[int, tuple[int, dt.datetime]] = {}

    def setup(self) -> None:
        from trains.services.trains import train_create

        super().setup()
        for pool in Pool.objects.filter(pk__in=self.world.pool_ids()).order_by("name"):
            live = self.world.trains.get(pool.pk)
            if live:  # a what-if on the live fleet: its own trains, as configured there, at this pace
                for spec in live:
                    _live_train_create(pool, {**spec, "pace": self.pace})
                continue
            train_create(
                pool=pool,
                pace=self.pace,
                name=f"train-{pool.name}",
                cycle_slo_s=round(self.config.cycle_slo_hours * 3600),
                visit_estimate_s=max(1, round(self.config.visit_minutes * 60)),
                visit_concurrency=self.config.planned_buffer_domains,
                auto_resume_after_s=3600,
                actor=ACTOR,
            )

    def arrive(self, arrival: Arrival) -> None:
        from trains.services.upgrade_scopes import scope_is_pool, upgrade_scope_hosts
        from trains.services.upgrades import upgrade_create

        duration_s = self.upgrade_known(arrival)
        pool = Pool.objects.get(pk=self.world.pool(arrival.pool).id)
        # Offboard on a failure rate well above the simulated one, not on a handful of hosts.
        own = {"max_failures": self.config.hosts_per_pool, "max_failure_rate": 0.1, "failure_rate_min_hosts": 50}
        # A live upgrade is created as it was live (its scope, phases and policy); its announced
        # duration, if it had one, is what the train sizes its visits with and the executor takes.
        created = {**own, **arrival.upgrade, "duration_s": duration_s}
        upgrade = upgrade_create(
            pool=pool,
            component=arrival.component,
            version=arrival.version,
            reason=f"simulated release of {arrival.component} {arrival.version}",
            **created,
            actor=ACTOR,
        )
        if not scope_is_pool(upgrade):
            self.scopes[upgrade.pk] = upgrade_scope_hosts(upgrade)
        if arrival.carried is not None:  # a live upgrade's phase in force goes on from where it stands live
            carried_phase_write(upgrade, arrival.carried)
            if arrival.carried.soak_ends_at is not None:
                self.soaking[upgrade.pk] = (pool.pk, arrival.carried.soak_ends_at)

    def step(self, pool_ids: set[int] | None) -> set[int]:
        from trains.services.tick import train_tick

        # First, so the train tick plans the widened phase at the same instant, as the live tick would.
        graduated = carried_soaks_graduate(self.soaking, pool_ids) if self.soaking else set()
        trains = _TICKING_TRAINS.rows() if pool_ids is None else _TICKING_TRAINS_OF.rows(ids=pool_ids)
        return graduated | {pool_id for train_id, pool_id in trains if train_tick(train_id=train_id).events}

    def wakes_at(self) -> dt.datetime | None:
        # The instant an autostopped train's countdown ends, when the train tick resumes it: without
        # it, the lane looked again only after the engine's idle step (6 h), and resumed that late.
        # So too when a carried soak ends (one ended already waits for its open tasks: their pool's tick
        # brings the policy back, and a past instant would hide a later one). A countdown already over
        # (a zero delay) is due at the next tick: the engine looks again only at instants to come.
        now = clock.now()
        soon = now + dt.timedelta(microseconds=1)
        rows = _RESUMING_TRAINS.rows()
        due = [max(since + dt.timedelta(seconds=after), soon) for since, after in rows if since and after is not None]
        return min(due + [ends_at for _, ends_at in self.soaking.values() if ends_at > now], default=None)

    def rollouts(self) -> list[Rollout]:
        from trains.models import Upgrade, UpgradeState
        from trains.selectors_forecast import ForecastCode

        names = {pool.id: pool.name for pool in self.world.pools}
        rollouts = []
        upgrades = Upgrade.objects.select_related("component_version__component", "pool")
        for upgrade in upgrades.order_by("created_at", "id"):
            promised = upgrade.promise_made_at is not None
            code = ForecastCode.SCHEDULED if upgrade.promised_at else ForecastCode.BEYOND_HORIZON if promised else ""
            rollouts.append(
                Rollout(
                    pool=names[upgrade.pool_id],
                    component=upgrade.component_version.component.name,
                    version=upgrade.component_version.version,
                    arrived=upgrade.created_at,
                    finished=upgrade.finished_at if upgrade.state == UpgradeState.COMPLETED else None,
                    outcome=upgrade.state if upgrade.state != UpgradeState.COMPLETED else "",
                    forecast_at=upgrade.promised_at,
                    forecast_code=str(code),
                    host_ids=self._scope_on_arrival(upgrade),
                )
            )
        return rollouts

    def _scope_on_arrival(self, upgrade: Upgrade) -> list[int] | None:
        """The hosts a scoped upgrade covered when it arrived (None: its whole pool). One this policy
        did not create has no record: its scope as it resolves now is the best there is."""
        from trains.services.upgrade_scopes import scope_is_pool, upgrade_scope_hosts

        if upgrade.pk in self.scopes:
            return self.scopes[upgrade.pk]
        return None if scope_is_pool(upgrade) else upgrade_scope_hosts(upgrade)


class TrainsSlidingPolicy(TrainsPolicy):
    """The same trains at the sliding pace (trains/services/pace.py): hosts return as each finishes
    and hosts of the next domain start, never more than a visit's worth out."""

    name = "trains-sliding"
    label = "maintenance trains, sliding pace"
    pace = "sliding"


@dataclass
class _PoolQueue:
    pool_id: int
    name: str
    waiting: deque[Rollout] = field(default_factory=deque)
    current: Rollout | None = None
    operations: list[int] = field(default_factory=list)


class RollingPolicy(Policy):
    """One upgrade at a time per pool, `concurrency` hosts at a time, each upgrade its own drain."""

    name = "rolling"
    label = "rolling per upgrade"
    gang = False

    def __init__(self, config: SimulationConfig, world: World) -> None:
        super().__init__(config, world)
        self.queues = {p.number: _PoolQueue(pool_id=p.id, name=p.name) for p in world.pools}
        self.done: list[Rollout] = []
        self.durations: dict[tuple[str, str], int] = {}  # the announced execution times (a spread scenario)

    def concurrency(self, pool_hosts: int) -> int:
        return self.config.rolling_concurrency or self.config.planned_buffer_hosts

    def arrive(self, arrival: Arrival) -> None:
        duration_s = self.upgrade_known(arrival)
        queue = self.queues[arrival.pool]
        rollout = Rollout(pool=queue.name, component=arrival.component, version=arrival.version, arrived=clock.now())
        scope = arrival.upgrade.get("scope")
        if scope:  # a live upgrade: the controller rolls it over its scope only, as the train would
            rollout.host_ids = resolve_scope(parse_scope(scope))
        queue.waiting.append(rollout)
        if duration_s is not None:
            self.durations[(rollout.component, rollout.version)] = duration_s

    def step(self, pool_ids: set[int] | None) -> set[int]:
        return {
            queue.pool_id
            for queue in self.queues.values()
            if (pool_ids is None or queue.pool_id in pool_ids) and self._advance(queue)
        }

    def _advance(self, queue: _PoolQueue) -> bool:
        if queue.current is None:
            if not queue.waiting:
                return False
            queue.current, queue.operations = queue.waiting.popleft(), []
        rollout = queue.current
        hosts = Host.objects.filter(pool_id=queue.pool_id)
        if rollout.host_ids is not None:
            hosts = hosts.filter(pk__in=rollout.host_ids)
        behind = hosts.exclude(
            pk__in=InstalledVersion.objects.filter(
                component__name=rollout.component, version__version=rollout.version
            ).values("host_id")
        )
        open_tasks = HostTask.objects.filter(operation_id__in=queue.operations, state__in=OPEN_TASK_STATES)
        in_flight = open_tasks.count()
        if not in_flight and not behind.exists():
            rollout.finished = clock.now()
            self.done.append(rollout)
            queue.current = None
            return True
        free = self.concurrency(self.config.hosts_per_pool) - in_flight
        if free <= 0:
            return False
        busy = HostTask.objects.filter(Q(state__in=OPEN_TASK_STATES), pool_id=queue.pool_id).values("host_id")
        ready = list(
            behind.filter(state=HostState.IN_SERVICE)
            .exclude(pk__in=busy)
            .order_by("hostname")[:free]
            .values_list("id", flat=True)
        )
        if not ready or (self.gang and in_flight):
            return False
        operation = operation_submit(
            kind=OperationKind.UPGRADE,
            scope=f"{self.name}: {len(ready)} hosts of pool {queue.name}",
            host_ids=ready,
            component=rollout.component,
            version=rollout.version,
            reason=f"{self.label}: {rollout.component} {rollout.version}",
            priority=200,
            gang=self.gang,
            **self._estimate(rollout),
            actor=ACTOR,
        )
        queue.operations.append(operation.pk)
        return True

    def _estimate(self, rollout: Rollout) -> dict[str, Any]:
        seconds = self.durations.get((rollout.component, rollout.version))
        return {} if seconds is None else {"estimated_duration_s": seconds}

    def rollouts(self) -> list[Rollout]:
        unfinished = [r for q in self.queues.values() for r in ([q.current] if q.current else []) + list(q.waiting)]
        for rollout in unfinished:
            rollout.outcome = "unfinished"
        return sorted(self.done + unfinished, key=lambda r: (r.arrived, r.pool))


class LockStepPolicy(RollingPolicy):
    """Each upgrade takes every host of the pool that needs it at once (a gang), one upgrade at a time."""

    name = "lockstep"
    label = "lock-step per pool"
    gang = True

    def concurrency(self, pool_hosts: int) -> int:
        return pool_hosts


POLICY_CLASSES: dict[str, type[Policy]] = {
    p.name: p for p in (TrainsPolicy, TrainsSlidingPolicy, RollingPolicy, LockStepPolicy)
}

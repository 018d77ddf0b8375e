"""What a simulation runs: the fleet's shape, the work arriving, the hardware's behaviour, the policies.

Every knob has a default a fleet operator would recognise; `SimulationConfig.errors()` says what is
wrong with a configuration in words, so the command line, the API and the forms refuse it clearly.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

POLICIES = ("trains", "trains-sliding", "rolling", "lockstep")
MAX_COMPONENTS = 200
MAX_HOSTS = 200_000  # also the largest job: jobs span hosts of one pool
MAX_DAYS = 366
MAX_SEED = 2_147_483_647  # the simulator profile keeps the seed in a PositiveIntegerField
# The rates bound what a run draws (failures, windows, arrivals are drawn one by one before time starts):
# unbounded, a typo like 1e9 drew for ever and held the advisor's one slot and a worker for hours.
MAX_PER_WEEK = 7 * 24  # one an hour, per pool
MAX_HOST_FAILURES_PER_DAY = 1  # every host breaking every day
WEEK_MINUTES = 7 * 24 * 60  # the longest a drain, an upgrade, a check or an undrain of one host may take
# Virtual time starts on a fixed Monday so the same seed gives the same report, byte for byte.
EPOCH = dt.datetime(2030, 1, 7, tzinfo=dt.UTC)


@dataclass(frozen=True)
class SimulationConfig:
    # fleet shape
    hosts: int = 2_000
    pools: int = 4
    hosts_per_domain: int = 25
    planned_buffer_domains: int = 1  # the planned buffer holds this many domains (trains visit that many at once)
    failure_buffer_fraction: float = 0.03
    job_hosts_min: int = 4  # jobs (services) span consecutive hosts; a drain interrupts every job it touches
    job_hosts_max: int = 32
    # time
    days: float = 7.0
    tick_minutes: float = 5.0  # the scheduler's cadence: every change happens on a tick
    # work arriving
    components: int = 3
    upgrades_per_week: float = 2.0  # per pool
    upgrades_at_start: int = 0  # per pool, a backlog waiting when time starts
    # the simulated hardware
    drain_minutes: float = 15.0
    execute_minutes: float = 30.0
    verify_minutes: float = 10.0
    undrain_minutes: float = 5.0
    execute_spread: float = 0.0  # per upgrade, the log-normal spread of its execution time around execute_minutes
    host_spread: float = 0.0  # per host and kind of work, the log-normal spread (mean 1) of its durations
    slow_host_fraction: float = 0.02  # the share of hosts whose drain takes slow_host_factor times longer
    slow_host_factor: float = 3.0
    host_failures_per_day: float = 0.0005  # per host
    upgrade_failure_rate: float = 0.005  # per host and upgrade
    verify_failure_rate: float = 0.002  # per check
    optout_windows_per_week: float = 2.0  # per pool, each 2-8 hours
    # trains and peers
    cycle_slo_hours: float = 72.0
    rolling_concurrency: int | None = None  # hosts at once per upgrade; default: the planned buffer
    policies: tuple[str, ...] = ("trains",)
    seed: int = 1
    scenario: str = "default"  # the named preset the other values came from (simulation/scenarios.py)
    # A what-if on the live fleet: the snapshot file the lanes build their world from, and when time starts.
    live_snapshot: str = ""
    start_at: str = ""  # ISO 8601; empty: EPOCH
    # A live pool's planned buffer in hosts, which need not be whole domains; None: planned_buffer_domains domains.
    planned_buffer_size: int | None = None

    @property
    def start(self) -> dt.datetime:
        return dt.datetime.fromisoformat(self.start_at) if self.start_at else EPOCH

    @property
    def end(self) -> dt.datetime:
        return self.start + dt.timedelta(days=self.days)

    @property
    def hosts_per_pool(self) -> int:
        return self.hosts // self.pools

    @property
    def domains_per_pool(self) -> int:
        return -(-self.hosts_per_pool // self.hosts_per_domain)

    @property
    def planned_buffer_hosts(self) -> int:
        if self.planned_buffer_size is not None:
            return self.planned_buffer_size
        return self.hosts_per_domain * self.planned_buffer_domains

    @property
    def failure_buffer_hosts(self) -> int:
        # A live pool's buffer in hosts comes here as a fraction (3 of 47): 47 x (3 / 47) is 2.9999...
        return max(1, math.floor(self.hosts_per_pool * self.failure_buffer_fraction + 1e-9))

    @property
    def visit_minutes(self) -> float:
        """One visit applying one upgrade, at best: drain, apply, three checks in parallel, undrain."""
        return self.drain_minutes + self.execute_minutes + self.verify_minutes + self.undrain_minutes

    @property
    def cycle_lower_bound_hours(self) -> float:
        """The shortest cycle of a pool's domains (cycle_lower_bound_hours_of)."""
        return self.cycle_lower_bound_hours_of(self.domains_per_pool)

    def cycle_lower_bound_hours_of(self, domains: int) -> float:
        """The shortest cycle of `domains` domains the buffers and visit times allow: every visit at its
        best, as many at once as the planned buffer holds (the arithmetic train_create checks the SLO
        against; the one definition: the run's refusal, the report and the missed cycles use it). A
        buffer smaller than a domain visits it in waves of the buffer's size, one after another."""
        visits = -(-domains // max(1, self.planned_buffer_domains))
        if self.planned_buffer_hosts < self.hosts_per_domain:
            visits *= -(-self.hosts_per_domain // max(1, self.planned_buffer_hosts))
        return visits * max(1, round(self.visit_minutes * 60)) / 3600

    def errors(self) -> dict[str, str]:
        """{field: what is wrong}; empty when the configuration can run. Never raises: the values are
        checked (finite, in range) before any arithmetic on them."""
        problems = self.value_errors()
        if problems:
            return problems
        return self._shape_errors()

    def value_errors(self) -> dict[str, str]:
        """What is wrong with each value on its own: a number, finite, in its range."""
        problems: dict[str, str] = {}

        def finite(value: Any) -> bool:  # NaN and ±inf pass every comparison below, or break the arithmetic
            if isinstance(value, bool) or not isinstance(value, int | float):
                return False
            return isinstance(value, int) or math.isfinite(value)  # isfinite overflows on an int past a float

        def at_least(name: str, minimum: float, unit: str = "", at_most: float | None = None) -> None:
            value = getattr(self, name)
            if at_most is not None and not (finite(value) and minimum <= value <= at_most):
                upper = f"{at_most:,}" if isinstance(at_most, int) else f"{at_most:g}"
                problems[name] = f"{name.replace('_', ' ')} must be a number from {minimum:g} to {upper}{unit}."
            elif not finite(value) or value < minimum:
                problems[name] = f"{name.replace('_', ' ')} must be a number of at least {minimum:g}{unit}."

        def fraction(name: str, upper: float = 1.0) -> None:
            value = getattr(self, name)
            if not finite(value) or not 0 <= value < upper:
                problems[name] = f"{name.replace('_', ' ')} must be at least 0 and below {upper:g}."

        for name in ("hosts", "pools", "hosts_per_domain", "planned_buffer_domains", "components"):
            at_least(name, 1)
        at_least("seed", 0, at_most=MAX_SEED)
        for name in ("job_hosts_min", "job_hosts_max"):
            at_least(name, 1, " hosts", at_most=MAX_HOSTS)
        at_least("days", 0.01, " day")
        at_least("tick_minutes", 0.1, " minutes", at_most=24 * 60)
        at_least("cycle_slo_hours", 0.1, " hours", at_most=MAX_DAYS * 24)
        for name in ("upgrades_per_week", "optout_windows_per_week"):
            at_least(name, 0, at_most=MAX_PER_WEEK)
        at_least("host_failures_per_day", 0, at_most=MAX_HOST_FAILURES_PER_DAY)
        at_least("upgrades_at_start", 0)
        if self.planned_buffer_size is not None:
            at_least("planned_buffer_size", 0, " hosts", at_most=MAX_HOSTS)
        for name in ("drain_minutes", "execute_minutes", "verify_minutes", "undrain_minutes"):
            at_least(name, 0, " minutes", at_most=WEEK_MINUTES)
        for name in ("upgrade_failure_rate", "verify_failure_rate", "failure_buffer_fraction"):
            fraction(name, 0.5)
        fraction("slow_host_fraction")
        at_least("slow_host_factor", 1, " times")
        for name in ("execute_spread", "host_spread"):
            at_least(name, 0)
            if name not in problems and getattr(self, name) > 3:
                problems[name] = f"{name.replace('_', ' ')} must be at most 3 (a factor of e³ either way)."
        problems.update(_scenario_and_start_errors(self))
        return problems

    def _shape_errors(self) -> dict[str, str]:
        """What is wrong with the values together (the fleet's shape, the SLO against the buffers)."""
        problems: dict[str, str] = {}
        if self.hosts > MAX_HOSTS:
            problems["hosts"] = f"Simulate at most {MAX_HOSTS:,} hosts."
        if self.days > MAX_DAYS:
            problems["days"] = f"Simulate at most {MAX_DAYS} days."
        if problems:  # the arithmetic below would overflow on a count past any float
            return problems
        if self.pools > self.hosts:
            problems["pools"] = f"{self.pools} pools need at least {self.pools} hosts."
        elif self.hosts_per_domain > self.hosts_per_pool:
            problems["hosts_per_domain"] = (
                f"A domain of {self.hosts_per_domain} hosts does not fit in a pool of {self.hosts_per_pool} hosts."
            )
        elif self.planned_buffer_hosts + self.failure_buffer_hosts >= self.hosts_per_pool:
            problems["planned_buffer_domains"] = (
                f"A planned buffer of {self.planned_buffer_hosts} hosts plus a failure buffer of "
                f"{self.failure_buffer_hosts} leaves nothing in service in a pool of {self.hosts_per_pool} hosts."
            )
        elif "trains" in self.policies and self.cycle_lower_bound_hours > self.cycle_slo_hours:
            problems["cycle_slo_hours"] = (
                f"A cycle of {self.domains_per_pool} domains of {self.hosts_per_domain} hosts takes at least "
                f"{self.cycle_lower_bound_hours:g} hours; the SLO of {self.cycle_slo_hours:g} hours cannot be met."
            )
        if self.job_hosts_min > self.job_hosts_max:
            problems["job_hosts_min"] = "The smallest job cannot be larger than the largest."
        if self.components > MAX_COMPONENTS:
            problems["components"] = f"Simulate at most {MAX_COMPONENTS} components."
        if self.rolling_concurrency is not None and (
            not isinstance(self.rolling_concurrency, int) or self.rolling_concurrency < 1
        ):
            problems["rolling_concurrency"] = "The rolling concurrency must be a whole number of at least 1 host."
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown or not self.policies:
            problems["policies"] = (
                f"Policies must be some of {', '.join(POLICIES)}; got {', '.join(unknown) or 'none'}."
            )
        elif len(set(self.policies)) != len(self.policies):
            problems["policies"] = "Name each policy once."
        return problems

    def replace(self, **changes: Any) -> SimulationConfig:
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _scenario_and_start_errors(config: SimulationConfig) -> dict[str, str]:
    from simulation.scenarios import SCENARIOS

    problems: dict[str, str] = {}
    if config.scenario not in SCENARIOS:
        problems["scenario"] = f"Scenarios are {', '.join(SCENARIOS)}; got {config.scenario!r}."
    if config.start_at:
        try:
            start = dt.datetime.fromisoformat(config.start_at)
        except (TypeError, ValueError):
            start = None
        if start is None or start.tzinfo is None:
            problems["start_at"] = f"start at must be an ISO 8601 time with its zone; got {config.start_at!r}."
    return problems


def config_fields() -> list[dataclasses.Field[Any]]:
    return list(dataclasses.fields(SimulationConfig))


@dataclass(frozen=True)
class CarriedPhase:
    """How far a live upgrade's phase in force had got, written on the lane's first phase after
    upgrade_create (simulation.from_live_trains): the lane cannot count the evidence itself, the tasks
    that showed it live are not copied."""

    successes_reached_at: dt.datetime | None = None  # its soak runs since then, as live
    # Its evidence was in live and it still soaked: it graduates then (the trains policy sees to it).
    soak_ends_at: dt.datetime | None = None
    picked_hosts: tuple[str, ...] = ()  # the hosts the phases so far picked from the pool, by name
    # The hosts counted against it live and those its failure rate counted as succeeded, by name (the
    # lane's CarriedHost rows): the lane's tick judges offboarding with them, each host once.
    failed_hosts: tuple[str, ...] = ()
    rate_succeeded_hosts: tuple[str, ...] = ()


@dataclass
class Arrival:
    """An upgrade arriving: at `at`, component `component` to `version` in pool number `pool`."""

    at: dt.datetime
    pool: int
    component: str
    version: str
    # upgrade_create's arguments beyond the target (a live upgrade's scope, phases, priority, deadline,
    # duration and failure policy: a what-if on the live fleet); empty: the simulator's own upgrade.
    upgrade: dict[str, Any] = field(default_factory=dict)
    carried: CarriedPhase | None = None  # a live upgrade's progress in its phase in force (None: none)


# A live train's state as a what-if's snapshot carries it beside train_create's arguments
# (from_live._trains_snapshot; policies._live_train_create sets it in the lane). The defaults are what the
# lane played a snapshot taken before the state was: every train running, resuming 3600 s after an autostop.
# `open_cycle`: where it stands in its open cycle (from_live_trains.open_cycle_snapshot; None: none
# open, or a snapshot taken before it was: the lane opens a cycle of its own at the first stop).
LIVE_TRAIN_STATE: dict[str, Any] = {
    "state": "running", "state_reason": "", "auto_resume_after_s": 3600, "recovered_since": None,
    "open_cycle": None,
}  # fmt: skip


@dataclass
class Failure:
    at: dt.datetime
    pool: int
    host_index: int  # the host's position in its pool


@dataclass
class Workload:
    arrivals: list[Arrival] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

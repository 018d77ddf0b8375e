"""Named scenarios: presets of the simulation's knobs for the regimes worth comparing.

- default: today's defaults (a few components, two upgrades a week per pool);
- meta: the regime the trains exist for, as the seeds describe it: more than 50 components, new
  upgrades several times a day, execution times that vary from upgrade to upgrade (a log-normal
  spread, so some upgrades run much longer), hosts that each take their own time for each kind of
  work (a log-normal spread per host and kind) and a share of slow hosts whose drains take longer.

A scenario only fills in defaults: what the command line (or a caller) names explicitly wins, and the
seed decides everything drawn from the scenario's distributions.
"""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

from simulation.config import SimulationConfig

SCENARIOS: dict[str, dict[str, Any]] = {
    "default": {},
    "meta": {
        "components": 60,
        "upgrades_per_week": 21.0,  # per pool: three a day
        "hosts_per_domain": 40,
        "execute_spread": 0.6,  # the slowest tenth of upgrades run over twice the median
        "host_spread": 0.15,  # the slowest tenth of hosts take about 1.2 times the mean for a kind of work
        "slow_host_fraction": 0.05,
        "slow_host_factor": 4.0,
        "cycle_slo_hours": 72.0,
    },
}


def scenario_config(name: str, **explicit: Any) -> SimulationConfig:
    """The scenario's values over the defaults, then the explicit ones over both. An unknown scenario
    name gives a configuration whose `errors()` says so."""
    values = {**SCENARIOS.get(name, {}), **explicit, "scenario": name}
    return SimulationConfig(**values)


def scenario_describe(name: str) -> str:
    """One line: what the scenario changes from the defaults."""
    changes = SCENARIOS.get(name)
    if changes is None:
        return f"unknown scenario {name!r}"
    if not changes:
        return f"{name}: the defaults"
    return f"{name}: " + ", ".join(f"{key.replace('_', ' ')} {value:g}" for key, value in changes.items())


def upgrade_execute_seconds(config: SimulationConfig, component: str, version: str) -> float:
    """How long one host takes to apply this upgrade: execute_minutes, spread log-normally per upgrade
    (the median stays execute_minutes); the seed and the upgrade decide, not the policy or the order."""
    base = config.execute_minutes * 60
    if not config.execute_spread:
        return base
    rng = random.Random(f"{config.seed}:execute:{component}:{version}")
    return round(base * rng.lognormvariate(0.0, config.execute_spread), 1)


def simulated_hardware_apply(config: SimulationConfig) -> None:
    """The scenario's slow hosts on the simulated drainer and its spread of durations per host (the
    engine wrote the other durations)."""
    from opsplanner.models import SimulatorProfile
    from opsplanner.services.simulator import simulator_host_spread_set

    simulator_host_spread_set(config.host_spread)
    profile = SimulatorProfile.current()
    profile.slow_host_fraction = Decimal(str(config.slow_host_fraction))
    profile.slow_drain_factor = config.slow_host_factor
    profile.full_clean()
    profile.save(update_fields=["slow_host_fraction", "slow_drain_factor"])


def upgrade_announced_seconds(
    config: SimulationConfig, component: str, version: str, announced: int | None = None
) -> float | None:
    """How long one host takes to apply this upgrade, as its release announces it (None: no time of
    its own, the simulated executor's execute_minutes and the default estimate). A live upgrade's own
    duration (`announced`, its duration_s) is the time: its train sizes its visits with it, and the
    lane's executor takes it as the live fleet would; else the scenario's spread draws one."""
    if announced:
        return float(announced)
    if config.execute_spread:
        return upgrade_execute_seconds(config, component, version)
    return None


def upgrade_duration_register(
    config: SimulationConfig, component: str, version: str, announced: int | None = None
) -> int | None:
    """Tell the simulated executor this upgrade's own execution time (upgrade_announced_seconds;
    nothing to do without one) and return it in whole seconds, as upgrade_create takes it."""
    seconds = upgrade_announced_seconds(config, component, version, announced)
    if seconds is None:
        return None
    from opsplanner.models import OperationKind, SimulatorProfile

    profile = SimulatorProfile.current()
    key = f"{OperationKind.UPGRADE.value}:{component}:{version}"
    profile.execute_by_kind = {**profile.execute_by_kind, key: {"seconds": seconds}}
    profile.save(update_fields=["execute_by_kind"])
    return max(1, round(seconds))

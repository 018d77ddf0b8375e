"""The domain-size advisor: simulate one pool's trains with each candidate domain size and weigh
what each costs.

A maintenance domain's size trades two costs. Small domains split jobs across several domains. The
train visits a pool's domains back to back, so a job is interrupted about once per cycle whatever
the size (jobs interrupted hardly tell sizes apart), but a job spanning k domains stays out for k
visits while its hosts still in service run nothing for it: small domains strand capacity, and a
cycle of many small visits takes long (it may miss its SLO). Large domains need a large planned
buffer: that many hosts are held back from jobs all the time. Each size is simulated for one cycle
applying one upgrade to the whole pool (with the configured hardware, failures and opt-out
windows), and costs, per cycle period (the SLO):

    interruption cost x jobs interrupted by the cycle's drains
    + capacity-hour cost x (buffer hosts x SLO hours + host-hours stranded by those interruptions)

Stranded host-hours (simulation.measure): while a job is interrupted, the host-hours of its hosts
still in service. A buffer host-hour and a stranded one are both an hour of a host doing no work,
so they cost the same. Interruptions begun by failures are left out of both terms: the size does
not decide them.

Sizes whose cycle missed the SLO are not recommended.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from simulation import plots
from simulation.config import SimulationConfig
from simulation.runner import Job


@dataclass(frozen=True)
class AdvisorRequest:
    config: SimulationConfig  # the pool: hosts (one pool), days, upgrades, hardware, seed
    sizes: tuple[int, ...]
    interruption_cost: float
    capacity_hour_cost: float

    def errors(self) -> dict[str, str]:
        # The values no size sets, on their own first: a NaN SLO would otherwise read as each size's days.
        problems = {k: v for k, v in self.config.value_errors().items() if k not in self._size_values(1)}
        if problems:
            return problems
        if not self.sizes:
            problems["sizes"] = "Give at least one domain size."
        elif len(self.sizes) > 12:
            problems["sizes"] = "Try at most 12 domain sizes at once."
        elif len(set(self.sizes)) != len(self.sizes):
            problems["sizes"] = "Give each domain size once."
        for size in self.sizes:
            size_problems = self.size_config(size).errors()
            size_problems.pop("cycle_slo_hours", None)  # a size that cannot meet the SLO is a finding, not an error
            problems.update({f"size {size}": message for message in size_problems.values()})
        for name in ("interruption_cost", "capacity_hour_cost"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < math.inf:
                problems[name] = f"The {name.replace('_', ' ')} must be a number, 0 or more."
        return problems

    def size_config(self, size: int) -> SimulationConfig:
        return self.config.replace(**self._size_values(size))

    def _size_values(self, size: int) -> dict[str, Any]:
        return {
            "pools": 1,
            "hosts_per_domain": size,
            "planned_buffer_domains": 1,
            "policies": ("trains",),
            "rolling_concurrency": None,
            "upgrades_per_week": 0.0,
            "upgrades_at_start": 1,
            "days": round(self.config.cycle_slo_hours * 1.25 / 24, 3),  # room to see a cycle miss its SLO
        }

    def feasible_sizes(self) -> list[int]:
        return [s for s in self.sizes if "cycle_slo_hours" not in self.size_config(s).errors()]

    def jobs(self) -> list[Job]:
        return [
            Job(policy="trains", pools=(0,), config=self.size_config(s), key=f"size-{s}") for s in self.feasible_sizes()
        ]


def _simulated_point(request: AdvisorRequest, size: int, pool: dict[str, Any]) -> dict[str, Any]:
    """One simulated size's figures and cost (the pool's measures from simulation.measure)."""
    config = request.config
    cycles = [c for c in pool["cycles"] if c[2] is not None]
    missed = sum(1 for c in pool["cycles"] if (c[2] if c[2] is not None else config.days * 24) > c[3])
    unfinished = sum(1 for r in pool["rollouts"] if r[3] is None)
    buffer_hours = size * config.cycle_slo_hours
    interrupted = pool["interrupted_by_drains"]
    stranded = pool["stranded_host_hours_by_drains"]
    interruption_cost = round(interrupted * request.interruption_cost, 2)
    capacity_cost = round((buffer_hours + stranded) * request.capacity_hour_cost, 2)
    return {
        "size": size,
        "domains": pool["domains"],
        "interrupted_jobs": interrupted,
        "buffer_host_hours": buffer_hours,
        "stranded_host_hours": stranded,
        "planned_hours_out": pool["planned_hours"],
        "cycles": len(cycles),
        "worst_cycle_hours": max((c[2] - c[1] for c in cycles), default=None),
        "cycles_missed": missed,
        "rollouts_unfinished": unfinished,
        "feasible": missed == 0 and unfinished == 0,
        "why": "" if missed == 0 and unfinished == 0 else "the cycle missed its SLO",
        "interruption_cost": interruption_cost,
        # Buffer and stranded host-hours together; the stranded part on its own, for the chart.
        "capacity_cost": capacity_cost,
        "stranded_cost": round(stranded * request.capacity_hour_cost, 2),
        "cost": round(interruption_cost + capacity_cost, 2),
    }


def advice(request: AdvisorRequest, results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The curve and the recommendation, from the simulated runs of each size (keyed size-N)."""
    config = request.config
    points: list[dict[str, Any]] = []
    for size in request.sizes:
        if size in request.feasible_sizes():
            points.append(_simulated_point(request, size, results[f"size-{size}"][0]["pools"][0]))
            continue
        bound = request.size_config(size)
        points.append(
            {
                "size": size,
                "domains": bound.domains_per_pool,
                "feasible": False,
                "why": f"a cycle takes at least {bound.cycle_lower_bound_hours:g} h, over the SLO",
                "cost": None,
            }
        )
    answer = {
        "points": points,
        "recommended": None,
        "reason": "no size can meet the cycle SLO",
        "interruption_cost": request.interruption_cost,
        "capacity_hour_cost": request.capacity_hour_cost,
        "pool_hosts": config.hosts,
        "cycle_slo_hours": config.cycle_slo_hours,
    }
    simulated = [p for p in points if p["cost"] is not None]
    if not simulated:
        return answer
    feasible = [p for p in simulated if p["feasible"]] or simulated
    best = min(feasible, key=lambda p: (p["cost"], p["size"]))
    answer["recommended"] = best["size"]
    answer["reason"] = (
        f"domains of {best['size']} hosts cost {best['cost']:g} per {config.cycle_slo_hours:g} h cycle: "
        f"{best['interrupted_jobs']} interrupted jobs x {request.interruption_cost:g} + "
        f"({best['buffer_host_hours']:g} buffer + {best['stranded_host_hours']:g} stranded host-hours) "
        f"x {request.capacity_hour_cost:g}"
        + ("" if best["feasible"] else "; no size met the cycle SLO, so this is the cheapest of them all")
    )
    return answer


def advice_svg(result: dict[str, Any]) -> str:
    points = [p for p in result["points"] if p["cost"] is not None]
    best = next((p for p in points if p["size"] == result["recommended"]), None)
    # A run advised before stranded host-hours were measured has no stranded part: its capacity is the buffer.
    series = [
        plots.Series(name="total cost", points=[(p["size"], p["cost"]) for p in points]),
        plots.Series(name="interruptions", points=[(p["size"], p["interruption_cost"]) for p in points], dashed=True),
        plots.Series(
            name="buffer capacity",
            points=[(p["size"], round(p["capacity_cost"] - p.get("stranded_cost", 0.0), 2)) for p in points],
            dashed=True,
        ),
    ]
    if all("stranded_cost" in p for p in points):
        series.append(
            plots.Series(
                name="stranded capacity", points=[(p["size"], p["stranded_cost"]) for p in points], dashed=True
            )
        )
    return plots.line_chart(
        title=f"Cost per cycle by maintenance-domain size ({result['pool_hosts']} hosts)",
        series=series,
        x_label="hosts per domain",
        y_label="cost",
        mark=(best["size"], best["cost"]) if best else None,
        mark_label=f"recommended: {best['size']}" if best else "",
        y_min=0,
    )

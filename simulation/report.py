"""The simulation report: shards merged into one summary per policy, then text, markdown, SVG and HTML.

`summarise` turns the per-shard measures of `measure.run_measure` into plain JSON-able rows (one totals row per
policy and one row per pool); every other function reads only that summary (and the raw runs for the charts).
A measure that does not apply (no cycles, no finished rollout, a policy that did not run) is None, shown as "—".

Stranded host-hours: while a job is interrupted (some of its hosts out), the host-hours of its hosts still in
service, which stand idle for it; by what began the interruption, as the interrupted jobs are counted.
"""

from __future__ import annotations

import json
import textwrap
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.template.loader import render_to_string
from django.utils.safestring import mark_safe

from simulation.config import SimulationConfig
from simulation.plots import Bar, HLine, Series, gantt_chart, line_chart
from simulation.rollout_measures import rollout_summary

DASH = "\u2014"
WIDTH = 120  # the text report's widest line
Row = dict[str, Any]
Runs = dict[str, list[dict[str, Any]]]
SHARD_ONLY = ("violations", "wall_seconds", "host_days_per_wall_second")
CAPTIONS = {
    "capacity.svg": "Hosts in service over the simulated time, summed over every pool, one line per policy. The dashed "
    "line is the summed floor (pool size less the planned and failure buffers): a line below it took more capacity "
    "out than the buffers allow.",
    "cycle_progress.svg": "Maintenance trains: visits completed in the current cycle of each train (up to four "
    "pools). Each ramp is one cycle and drops back to zero when the next begins; a steeper ramp is a faster cycle.",
    "gantt.svg": "Maintenance train visits in the first pool: one row per maintenance domain, one bar per visit from "
    "its start to its end, coloured by how it ended (skipped: cancelled without work).",
    "rollouts.svg": "Time to full rollout: hours from an upgrade's arrival until every host of its pool ran it, by "
    "arrival hour, one line per policy. Only finished rollouts are drawn; unfinished ones are counted in the table.",
}


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(float(value), digits)


def _mean(values: list[float]) -> float | None:
    return _r(sum(values) / len(values)) if values else None


def _worst(values: list[float]) -> float | None:
    return _r(max(values)) if values else None


def cycle_lower_bound_hours(config: SimulationConfig, domains: int) -> float:
    """The shortest possible cycle (SimulationConfig.cycle_lower_bound_hours_of), as the report rounds it."""
    return _r(config.cycle_lower_bound_hours_of(domains)) or 0.0


def _policy_names(config: SimulationConfig, runs: Runs) -> list[str]:
    return list(dict.fromkeys([*config.policies, *runs]))


def _pools(shards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((pool for shard in shards for pool in shard.get("pools") or []), key=lambda p: str(p.get("name")))


def fleet_in_service(pools: list[dict[str, Any]], end: float) -> list[tuple[float, int]]:
    """The sum of the pools' in-service step functions, as (hour, hosts) points from 0 to `end`."""
    if not pools:
        return []
    level = 0
    changes: defaultdict[float, int] = defaultdict(int)
    for pool in pools:
        samples = pool.get("samples") or []
        previous = pool.get("hosts", 0) if samples else pool.get("min_in_service", pool.get("hosts", 0))
        level += previous
        for row in samples:
            changes[max(0.0, float(row[0]))] += row[1] - previous
            previous = row[1]
    points = [(0.0, level)]
    for at in sorted(changes):
        level += changes[at]
        if at == points[-1][0]:
            points[-1] = (at, level)
        else:
            points.append((at, level))
    if points[-1][0] < end:
        points.append((float(end), level))
    return points


def _measure(config: SimulationConfig, policy: str, pools: list[dict[str, Any]], *, fleet: bool) -> Row:
    def total(key: str) -> Any:
        return sum(pool.get(key) or 0 for pool in pools)

    def measured(key: str) -> float | None:  # shards measured before the measure existed: "—", not a false 0
        return _r(total(key), 2) if any(key in pool for pool in pools) else None

    hosts, drains, end = total("hosts"), total("drains"), config.days * 24
    rollouts = [r for pool in pools for r in pool.get("rollouts") or []]
    spans = [r[3] - r[2] for r in rollouts if r[2] is not None and r[3] is not None]
    cycles = [c for pool in pools for c in pool.get("cycles") or []]
    durations = [c[2] - c[1] for c in cycles if c[1] is not None and c[2] is not None]
    has_cycles = policy == "trains" or bool(cycles)
    domains = max((pool.get("domains") or config.domains_per_pool for pool in pools), default=config.domains_per_pool)
    # A completed cycle that ended after its deadline, or one still open when its deadline passed in the run.
    missed = sum(1 for c in cycles if c[3] is not None and (end if c[2] is None else c[2]) > c[3])
    if fleet:
        in_service = [level for _, level in fleet_in_service(pools, end)]
        minimum = min(in_service) if in_service else None
    else:
        minimum = min((pool.get("min_in_service", pool.get("hosts", 0)) for pool in pools), default=None)
    return {
        "hosts": hosts,
        "pools": len(pools),
        "jobs": total("jobs"),
        "floor": total("floor"),
        "drains": drains,
        "drains_per_host": _r(drains / hosts) if hosts else None,
        "planned_hours": _r(total("planned_hours"), 2),
        "failure_hours": _r(total("failure_hours"), 2),
        "interrupted_by_drains": total("interrupted_by_drains"),
        "interrupted_by_failures": total("interrupted_by_failures"),
        "stranded_host_hours_by_drains": measured("stranded_host_hours_by_drains"),
        "stranded_host_hours_by_failures": measured("stranded_host_hours_by_failures"),
        "rollouts": len(rollouts),
        "rollouts_finished": len(spans),
        "rollouts_unfinished": len(rollouts) - len(spans),
        "rollout_mean_hours": _mean(spans),
        "rollout_worst_hours": _worst(spans),
        "cycles": len(cycles) if has_cycles else None,
        "cycles_completed": len(durations) if has_cycles else None,
        "cycle_mean_hours": _mean(durations),
        "cycle_worst_hours": _worst(durations),
        "cycle_slo_hours": _r(config.cycle_slo_hours) if has_cycles else None,
        "cycle_lower_bound_hours": cycle_lower_bound_hours(config, domains) if has_cycles else None,
        "cycles_missed_slo": missed if has_cycles else None,
        "host_cycles_redrained": total("host_cycles_redrained") if has_cycles else None,
        "autostops": total("autostops"),
        "offboardings": total("offboardings"),
        # Each pool's hours below its floor, summed over the pools: pool-hours (a pool's row: its hours).
        "hours_below_floor": _r(total("hours_below_floor"), 2),
        "min_in_service": minimum,
        **rollout_summary(config, pools),
    }


def summarise(config: SimulationConfig, runs: Runs) -> dict[str, Any]:
    """Per policy a totals row over all its shards and pools, and a row per pool; plain JSON-able data."""
    summary: dict[str, Any] = {
        "config": json.loads(json.dumps(config.as_dict())),
        "fleet": {
            "hosts_per_pool": config.hosts_per_pool,
            "domains_per_pool": config.domains_per_pool,
            "planned_buffer_hosts": config.planned_buffer_hosts,
            "failure_buffer_hosts": config.failure_buffer_hosts,
            "visit_minutes": config.visit_minutes,
            "cycle_lower_bound_hours": cycle_lower_bound_hours(config, config.domains_per_pool),
        },
        "policies": [],
        "labels": {},
        "totals": {},
        "pools": {},
        "notes": {},  # per policy, what a shard's pools say the run assumed (from_live: a train stopped live)
    }
    # A forecast of the live fleet: per pool, what its lanes ran with (from_live_trains.live_setting).
    setting = {str(p.get("name")): p["setting"] for s in runs.values() for p in _pools(s) if p.get("setting")}
    if setting:
        summary["live_setting"] = setting
    for policy in _policy_names(config, runs):
        shards = runs.get(policy) or []
        pools = _pools(shards)
        row = _measure(config, policy, pools, fleet=True)
        wall = sum(shard.get("wall_seconds") or 0 for shard in shards)
        violations = [str(v) for shard in shards for v in shard.get("violations") or []]
        row |= {
            "ran": bool(shards),
            "shards": len(shards),
            "violations": len(violations),
            "violation_samples": violations[:10],
            "invariant_checks": sum(shard.get("invariant_checks") or 0 for shard in shards),
            "failures_applied": sum(shard.get("failures_applied") or 0 for shard in shards),
            "failures_absorbed": sum(shard.get("failures_absorbed") or 0 for shard in shards),
            "wall_seconds": _r(wall, 2),
            "host_days_per_wall_second": _r(row["hosts"] * config.days / wall, 1) if wall > 0 else None,
        }
        if not shards:
            row = dict.fromkeys(row) | {"ran": False, "shards": 0, "violation_samples": []}
        summary["policies"].append(policy)
        summary["labels"][policy] = next((s["label"] for s in shards if s.get("label")), policy)
        summary["notes"][policy] = list(dict.fromkeys(note for pool in pools for note in pool.get("notes") or []))
        summary["totals"][policy] = row
        summary["pools"][policy] = [
            {"name": str(pool.get("name")), **_measure(config, policy, [pool], fleet=False)} | dict.fromkeys(SHARD_ONLY)
            for pool in pools
        ]
    return summary


# -- formatting ------------------------------------------------------------------------------------------------------


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return DASH
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def _pair(first: Any, second: Any, digits: int = 1) -> str:
    if first is None and second is None:
        return DASH
    return f"{_num(first, digits)} / {_num(second, digits)}"


def _get(key: str, digits: int = 1) -> Callable[[Row], str]:
    return lambda row: _num(row.get(key), digits)


def _finished(row: Row) -> str:
    return DASH if row.get("rollouts") is None else f"{row['rollouts_finished']:,} / {row['rollouts']:,}"


def _reach(row: Row) -> str:
    shares = [row.get(key) for key in ("reach_24h_mean", "reach_72h_mean", "reach_7d_mean")]
    return DASH if all(v is None for v in shares) else " / ".join(_num(v, 3) for v in shares)


def _cycles(row: Row) -> str:
    if not row.get("cycles_completed"):
        return _get("cycles_completed")(row)
    return f"{_num(row['cycles_completed'])} ({_pair(row['cycle_mean_hours'], row['cycle_worst_hours'])})"


def _forecasts_kept(row: Row) -> str:
    return DASH if row.get("forecasts_due") is None else f"{row['forecasts_kept']:,} / {row['forecasts_due']:,}"


def _forecast_late(row: Row) -> str:
    return _pair(row.get("forecast_late_median_hours"), row.get("forecast_late_p90_hours"))


def _pool_hours(row: Row) -> str:
    value = row.get("hours_below_floor")
    return DASH if value is None else f"{_num(value)} pool-hours"


# Summed over the pools of a policy, time below the floor is pool-hours: two pools below for the
# same hour are 2, not 1 (the key stays `hours_below_floor`; each pool measures its own hours).
POOL_HOURS_BELOW_FLOOR = "pool-hours below floor (summed over pools)"
MEASURES: list[tuple[str, str, Callable[[Row], str]]] = [
    ("hosts", "hosts", _get("hosts")),
    ("drains", "drains", _get("drains")),
    ("drains_per_host", "drains per host", _get("drains_per_host", 2)),
    ("planned_hours", "planned capacity-hours out", _get("planned_hours")),
    ("failure_hours", "failure capacity-hours out", _get("failure_hours")),
    ("interrupted_by_drains", "interrupted jobs (drains)", _get("interrupted_by_drains")),
    ("interrupted_by_failures", "interrupted jobs (failures)", _get("interrupted_by_failures")),
    (
        "stranded_host_hours_by_drains",
        "interrupted jobs' stranded host-hours (drains)",
        _get("stranded_host_hours_by_drains"),
    ),
    (
        "stranded_host_hours_by_failures",
        "interrupted jobs' stranded host-hours (failures)",
        _get("stranded_host_hours_by_failures"),
    ),
    ("rollouts", "rollouts finished / total", _finished),
    ("rollouts_unfinished", "rollouts unfinished", _get("rollouts_unfinished")),
    (
        "rollout_hours",
        "time to full rollout mean / worst h",
        lambda r: _pair(r["rollout_mean_hours"], r["rollout_worst_hours"]),
    ),
    ("cycles_completed", "cycles completed", _get("cycles_completed")),
    ("cycle_hours", "cycle time mean / worst h", lambda r: _pair(r["cycle_mean_hours"], r["cycle_worst_hours"])),
    ("cycle_slo_hours", "cycle SLO h", _get("cycle_slo_hours")),
    ("cycle_lower_bound_hours", "cycle lower bound h", _get("cycle_lower_bound_hours")),
    ("cycles_missed_slo", "cycles that missed their SLO", _get("cycles_missed_slo")),
    ("cycles_missed_keepable", "of them, SLO at or above the lower bound", _get("cycles_missed_keepable")),
    ("host_cycles_redrained", "host-cycles drained more than once", _get("host_cycles_redrained")),
    ("reach_24h_mean", "hosts reached per upgrade at 24 h (mean share)", _get("reach_24h_mean", 3)),
    ("reach_72h_mean", "hosts reached per upgrade at 72 h (mean share)", _get("reach_72h_mean", 3)),
    ("reach_7d_mean", "hosts reached per upgrade at 7 days (mean share)", _get("reach_7d_mean", 3)),
    ("forecasts_kept", "upgrades done by their first forecast", _forecasts_kept),
    ("forecast_late", "done after that forecast (median / p90 h)", _forecast_late),
    ("autostops", "autostops", _get("autostops")),
    ("offboardings", "offboardings", _get("offboardings")),
    ("hours_below_floor", POOL_HOURS_BELOW_FLOOR, _get("hours_below_floor")),
    ("min_in_service", "minimum in service", _get("min_in_service")),
    ("violations", "invariant violations", _get("violations")),
    ("wall_seconds", "wall seconds", _get("wall_seconds")),
    ("host_days_per_wall_second", "simulated host-days per wall second", _get("host_days_per_wall_second")),
]
# A row of one pool shows that pool's own figure: its hours below the floor are plain hours.
POOL_LABELS = {"hours_below_floor": "hours below floor"}
POOL_MEASURES = [(key, POOL_LABELS.get(key, label), fmt) for key, label, fmt in MEASURES if key not in SHARD_ONLY]


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "\u2026"


def _table(title: str, headers: list[tuple[str, str]], rows: list[Row], measures: list[Any]) -> list[str]:
    """Measures down, one column per row, split into several blocks when the columns do not fit in WIDTH."""
    if not rows:
        return [title, "  (nothing to show)"]
    label_w = max(len(label) for _, label, _ in measures) + 2
    cells = [[fmt(row) for row in rows] for _, _, fmt in measures]
    widest = max(len(text) for line in [*cells, *(list(h) for h in headers)] for text in line)
    col_w = min(max(12, widest) + 2, WIDTH - label_w)
    per_block = max(1, (WIDTH - label_w) // col_w)
    lines: list[str] = []
    for first in range(0, len(rows), per_block):
        columns = range(first, min(len(rows), first + per_block))
        lines.append(title if first == 0 else f"{title} (continued)")
        for part in (0, 1):
            lines.append(" " * label_w + "".join(_fit(headers[i][part], col_w - 2).rjust(col_w) for i in columns))
        lines.append("-" * (label_w + col_w * len(columns)))
        for (_, label, _), line in zip(measures, cells, strict=True):
            lines.append(label.ljust(label_w) + "".join(_fit(line[i], col_w - 2).rjust(col_w) for i in columns))
        lines.append("")
    return lines[:-1]


def _header(summary: dict[str, Any]) -> list[str]:
    """The run's configuration; for a forecast of the live fleet, the generated fleet's shape,
    arrivals, buffers and visit time are not what its lanes ran with: `_setting` says what they did."""
    c, f = summary["config"], summary["fleet"]
    failures = (
        f"Failures: hosts {c['host_failures_per_day']:g} per host-day; upgrades {c['upgrade_failure_rate']:.2%} "
        f"per host; failed checks {c['verify_failure_rate']:.2%}"
    )
    if summary.get("live_setting"):
        return [
            f"OpsPlanner forecast of the live fleet: {c['hosts']:,} hosts in {c['pools']:,} pools, {c['days']:g} days "
            f"from {c['start_at']}, seed {c['seed']}",
            failures,
        ]
    return [
        f"OpsPlanner fleet simulation: {c['hosts']:,} hosts in {c['pools']:,} pools of {f['hosts_per_pool']:,} "
        f"({f['domains_per_pool']:,} domains of {c['hosts_per_domain']:,} hosts), {c['days']:g} days, seed {c['seed']}",
        f"Upgrades: {c['upgrades_per_week']:g} per pool per week over {c['components']} components",
        failures,
        f"Buffers: planned {c['planned_buffer_domains']} domain(s) = {f['planned_buffer_hosts']:,} hosts, failure "
        f"{f['failure_buffer_hosts']:,} hosts per pool; a visit takes {f['visit_minutes']:g} min; cycle SLO "
        f"{c['cycle_slo_hours']:g} h, lower bound {f['cycle_lower_bound_hours']:g} h",
    ]


def _setting(summary: dict[str, Any]) -> list[str]:
    """What the lanes of a forecast of the live fleet ran with, pool by pool (none for a generated fleet)."""
    return [line for lines in (summary.get("live_setting") or {}).values() for line in lines]


def _notes(summary: dict[str, Any]) -> list[str]:
    """Each note once, naming the policies it is about; a summary from before notes has none."""
    policies: dict[str, list[str]] = {}
    for policy, notes in (summary.get("notes") or {}).items():
        for note in notes:
            policies.setdefault(note, []).append(policy)
    return [f"Note ({', '.join(names)}): {note}" for note, names in policies.items()]


def _headers(summary: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p, summary["labels"][p] if summary["totals"][p]["ran"] else "not run") for p in summary["policies"]]


def report_text(summary: dict[str, Any]) -> str:
    """A fixed-width report (at most WIDTH characters a line): configuration, policies side by side, then pools."""
    policies = summary["policies"]
    # What the lanes ran with and the notes are wrapped, not cut to WIDTH as the other lines are: every word matters.
    said = [*_setting(summary), *_notes(summary)]
    wrapped = [line for note in said for line in textwrap.wrap(note, WIDTH, subsequent_indent="  ")]
    lines = [*_header(summary), *wrapped, ""]
    lines += _table("Policies side by side", _headers(summary), [summary["totals"][p] for p in policies], MEASURES)
    for policy in policies:
        for sample in summary["totals"][policy]["violation_samples"] or []:
            lines.append(f"INVARIANT VIOLATION ({policy}): {sample}")
    for policy in policies:
        rows = summary["pools"][policy]
        if rows:
            headers = [(row["name"], f"{row['hosts']:,} hosts") for row in rows]
            lines += ["", *_table(f"{policy} ({summary['labels'][policy]}) per pool", headers, rows, POOL_MEASURES)]
    return "\n".join(_fit(line.rstrip(), WIDTH) for line in lines) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def report_markdown_table(summary: dict[str, Any]) -> str:
    """The headline measures side by side as a GitHub markdown table."""

    def interrupted(row: Row) -> str:
        if row.get("interrupted_by_drains") is None:
            return DASH
        return f"{_num(row['interrupted_by_drains'])} by drains, {_num(row['interrupted_by_failures'])} by failures"

    def stranded(row: Row) -> str:
        drains, failures = row.get("stranded_host_hours_by_drains"), row.get("stranded_host_hours_by_failures")
        return (
            DASH if drains is None and failures is None else f"{_num(drains)} by drains, {_num(failures)} by failures"
        )

    rows: list[tuple[str, Callable[[Row], str]]] = [
        ("drains per host", _get("drains_per_host", 2)),
        ("planned capacity-hours out", _get("planned_hours")),
        ("failure capacity-hours out", _get("failure_hours")),
        ("interrupted jobs", interrupted),
        ("interrupted jobs' stranded host-hours", stranded),
        ("time to full rollout (mean / worst h)", lambda r: _pair(r["rollout_mean_hours"], r["rollout_worst_hours"])),
        ("rollouts finished", _finished),
        ("hosts reached per upgrade at 24 h / 72 h / 7 days (mean share)", _reach),
        ("cycles completed (mean / worst h)", _cycles),
        ("cycles that missed a keepable SLO", _get("cycles_missed_keepable")),
        ("upgrades done by their first forecast", _forecasts_kept),
        ("done after that forecast (median / p90 h)", _forecast_late),
        ("host-cycles drained more than once", _get("host_cycles_redrained")),
        # The row keeps its label (BENCHMARKS.md's tables and their test name it); its cells say the unit.
        ("hours below floor", _pool_hours),
        ("invariant violations", _get("violations")),
    ]
    policies = summary["policies"]
    lines = [
        "| measure | " + " | ".join(_md(f"{summary['labels'][p]} (`{p}`)") for p in policies) + " |",
        "|---|" + "---:|" * len(policies),
    ]
    for label, fmt in rows:
        lines.append(f"| {label} | " + " | ".join(_md(fmt(summary["totals"][p])) for p in policies) + " |")
    return "\n".join(lines) + "\n"


# -- charts ----------------------------------------------------------------------------------------------------------


def _cycle_progress(pool: dict[str, Any], end: float) -> list[tuple[float, float]]:
    """Visits done within the current cycle, as a step function: 0 at each cycle's start, +1 at each visit's end."""
    ends = sorted(v[2] for v in pool.get("visits") or [] if v[2] is not None and v[3] == "done")
    points: list[tuple[float, float]] = []
    for _, start, finish, _ in sorted((c for c in pool.get("cycles") or [] if c[1] is not None), key=lambda c: c[1]):
        stop = end if finish is None else finish
        points.append((start, 0))
        points += [(at, count) for count, at in enumerate((t for t in ends if start < t <= stop), start=1)]
    if points and points[-1][0] < end:
        points.append((end, points[-1][1]))
    return points


def _visit_bars(pool: dict[str, Any], end: float) -> tuple[list[str], list[Bar]]:
    visits = sorted((v for v in pool.get("visits") or [] if v[1] is not None), key=lambda v: v[1])
    cycles = sorted((c for c in pool.get("cycles") or [] if c[1] is not None), key=lambda c: c[1])
    states = {"done": "done", "running": "running", "cancelled": "skipped", "skipped": "skipped"}
    bars = []
    for domain, start, finish, state, skips in visits:
        number = next((c[0] for c in reversed(cycles) if c[1] <= start), "?")
        until = "still running" if finish is None else f"{finish:.1f}"
        label = f"{domain}, cycle {number} {start:.1f}-{until} h, {state}" + (f", {skips} skips" if skips else "")
        finish = end if finish is None else finish
        bars.append(Bar(row=str(domain), start=start, end=finish, state=states.get(state, "failed"), label=label))
    return list(dict.fromkeys(str(v[0]) for v in visits)), bars


def plots(config: SimulationConfig, runs: Runs) -> dict[str, str]:
    """SVG texts by file name: capacity and rollouts always, the trains' cycle progress and Gantt when trains ran."""
    end, labels, pools = config.days * 24, {}, {}
    for policy in _policy_names(config, runs):
        if runs.get(policy):
            pools[policy] = _pools(runs[policy])
            labels[policy] = next((s["label"] for s in runs[policy] if s.get("label")), policy)
    capacity = [Series(labels[p], fleet_in_service(pools[p], end), step=True) for p in pools]
    floors = list(dict.fromkeys(sum(pool.get("floor") or 0 for pool in pools[p]) for p in pools))
    svgs = {
        "capacity.svg": line_chart(
            title="Hosts in service, all pools",
            series=capacity,
            hlines=[HLine(f"floor {floor:,} (summed over pools)", floor) for floor in floors],
            x_label="simulated hours",
            y_label="hosts in service",
        )
    }
    if pools.get("trains"):
        svgs["cycle_progress.svg"] = line_chart(
            title="Maintenance trains: visits done in the current cycle",
            series=[Series(str(pool["name"]), _cycle_progress(pool, end), step=True) for pool in pools["trains"][:4]],
            x_label="simulated hours",
            y_label="visits done",
            y_min=0,
        )
        first = pools["trains"][0]
        rows, bars = _visit_bars(first, end)
        svgs["gantt.svg"] = gantt_chart(
            title=f"Maintenance train visits, pool {first['name']}",
            rows=rows,
            bars=bars,
            start=0,
            end=end,
            x_label="simulated hours",
            max_rows=100,
        )
    spans = {p: [r for pool in pools[p] for r in pool.get("rollouts") or []] for p in pools}
    rollouts = [
        Series(labels[p], sorted((r[2], r[3] - r[2]) for r in spans[p] if r[2] is not None and r[3] is not None))
        for p in pools
    ]
    svgs["rollouts.svg"] = line_chart(
        title="Time to full rollout per upgrade",
        series=rollouts,
        x_label="arrival (simulated hours)",
        y_label="hours to full rollout",
        y_min=0,
    )
    return svgs


# -- HTML and files --------------------------------------------------------------------------------------------------


def report_html(summary: dict[str, Any], svgs: dict[str, str]) -> str:
    """A standalone HTML page (inline CSS, charts inline): the configuration, the tables and the charts."""
    policies = summary["policies"]
    order = [*CAPTIONS, *sorted(set(svgs) - set(CAPTIONS))]
    context = {
        "header": [*_header(summary), *_setting(summary), *_notes(summary)],
        "headers": _headers(summary),
        "rows": [(label, [fmt(summary["totals"][p]) for p in policies]) for _, label, fmt in MEASURES],
        "violations": [(p, v) for p in policies for v in summary["totals"][p]["violation_samples"] or []],
        "pool_tables": [
            {
                "policy": p,
                "label": summary["labels"][p],
                "pools": [row["name"] for row in summary["pools"][p]],
                "rows": [(label, [fmt(row) for row in summary["pools"][p]]) for _, label, fmt in POOL_MEASURES],
            }
            for p in policies
            if summary["pools"][p]
        ],
        # Safe: plots escapes every text it writes.
        "charts": [
            {"name": name, "caption": CAPTIONS.get(name, ""), "svg": mark_safe(svgs[name])}
            for name in order
            if name in svgs
        ],
    }
    return render_to_string("simulation/report.html", context)


def report_write(directory: Path, config: SimulationConfig, runs: Runs) -> dict[str, Path]:
    """Writes report.txt, report.html, summary.json, runs.json and the SVG charts; returns name -> path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    summary = summarise(config, runs)
    svgs = plots(config, runs)
    texts = {
        "report.txt": report_text(summary),
        "report.html": report_html(summary, svgs),
        "summary.json": json.dumps(summary, sort_keys=True, indent=1, ensure_ascii=False) + "\n",
        "runs.json": json.dumps(runs, sort_keys=True) + "\n",
        **svgs,
    }
    written = {name: directory / name for name in texts}
    for name, text in texts.items():
        written[name].write_text(text, encoding="utf-8")
    return written

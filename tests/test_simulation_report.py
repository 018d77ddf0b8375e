"""The simulation report: shards merged right, measures computed right, text/markdown/HTML/files produced."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from simulation.config import SimulationConfig
from simulation.report import (
    cycle_lower_bound_hours,
    fleet_in_service,
    plots,
    report_html,
    report_markdown_table,
    report_text,
    report_write,
    summarise,
)

# 4 pools of 100 hosts, domains of 20 (5 per pool), two domains at a time, one-hour visits: bound ceil(5/2) * 1 h.
CONFIG = SimulationConfig(
    hosts=400,
    pools=4,
    hosts_per_domain=20,
    planned_buffer_domains=2,
    days=2,
    cycle_slo_hours=24,
    policies=("trains", "rolling", "lockstep"),
)


def pool(name, **fields):
    base = {
        "name": name,
        "hosts": 100,
        "domains": 5,
        "floor": 57,
        "samples": [[0.0, 100, 0, 0]],
        "planned_hours": 0.0,
        "failure_hours": 0.0,
        "hours_below_floor": 0.0,
        "min_in_service": 100,
        "drains": 0,
        "jobs": 10,
        "interrupted_by_drains": 0,
        "interrupted_by_failures": 0,
        "autostops": 0,
        "offboardings": 0,
        "cycles": [],
        "visits": [],
        "rollouts": [],
    }
    return base | fields


def shard(policy, pools, wall=10.0, violations=()):
    labels = {"trains": "maintenance trains", "rolling": "rolling per upgrade", "lockstep": "lock-step per pool"}
    return {
        "policy": policy,
        "label": labels[policy],
        "wall_seconds": wall,
        "ticks": 576,
        "rounds": 900,
        "invariant_checks": 3,
        "violations": list(violations),
        "failures_applied": 1,
        "failures_absorbed": 0,
        "pools": pools,
    }


def make_runs():
    trains_a = pool(
        "sim-00",
        drains=50,
        interrupted_by_drains=10,
        interrupted_by_failures=1,
        stranded_host_hours_by_drains=120.25,
        stranded_host_hours_by_failures=3.0,
        planned_hours=40.0,
        failure_hours=2.5,
        samples=[[0.0, 100, 0, 0], [1.0, 80, 20, 0], [2.0, 100, 0, 0]],
        min_in_service=80,
        rollouts=[["os", "2", 1.0, 11.0, ""], ["fw", "3", 5.0, None, "unfinished"]],
        cycles=[[1, 0.0, 20.0, 24.0], [2, 20.0, None, 44.0]],  # the open one passed its deadline before 48 h
        visits=[
            ["sim-00-d0", 0.0, 1.0, "done", 0],
            ["sim-00-d1", 0.0, 1.0, "done", 0],
            ["sim-00-d2", 1.0, 2.5, "cancelled", 1],
            ["sim-00-d2", 2.5, 3.5, "done", 0],
            ["sim-00-d0", 20.0, 21.0, "done", 0],
            ["sim-00-d1", 20.0, None, "running", 0],
        ],
    )
    trains_b = pool(
        "sim-01",
        drains=30,
        interrupted_by_drains=5,
        stranded_host_hours_by_drains=60.5,
        stranded_host_hours_by_failures=0.0,
        planned_hours=30.0,
        hours_below_floor=0.5,
        autostops=1,
        samples=[[0.0, 100, 0, 0], [1.5, 79, 20, 1], [3.0, 100, 0, 0]],
        min_in_service=79,
        rollouts=[["os", "2", 2.0, 32.0, ""]],
        cycles=[[1, 0.0, 30.0, 24.0]],  # ended after its deadline
        host_cycles_redrained=2,
    )
    rolling = [
        pool("sim-00", drains=200, interrupted_by_drains=40, rollouts=[["os", "2", 1.0, 5.0, ""]]),
        pool("sim-01", drains=100, interrupted_by_drains=20, offboardings=2),
    ]
    lockstep = [pool("sim-00", drains=100, rollouts=[["os", "2", 1.0, 2.0, ""]]), pool("sim-01", drains=100)]
    return {
        "trains": [shard("trains", [trains_b], wall=5.0), shard("trains", [trains_a], wall=10.0)],
        "rolling": [shard("rolling", rolling, wall=4.0)],
        "lockstep": [shard("lockstep", lockstep, wall=0.0)],
    }


def test_shards_are_merged_into_sums():
    summary = summarise(CONFIG, make_runs())
    trains = summary["totals"]["trains"]
    assert summary["policies"] == ["trains", "rolling", "lockstep"]
    assert (trains["hosts"], trains["pools"], trains["shards"]) == (200, 2, 2)
    assert trains["drains"] == 80
    assert trains["drains_per_host"] == pytest.approx(0.4)
    assert (trains["interrupted_by_drains"], trains["interrupted_by_failures"]) == (15, 1)
    assert (trains["stranded_host_hours_by_drains"], trains["stranded_host_hours_by_failures"]) == (180.75, 3.0)
    assert summary["pools"]["trains"][1]["stranded_host_hours_by_drains"] == 60.5
    # Shards measured before stranded host-hours existed: no figure, not a false 0.
    assert summary["totals"]["rolling"]["stranded_host_hours_by_drains"] is None
    assert (trains["planned_hours"], trains["failure_hours"]) == (70.0, 2.5)
    assert (trains["autostops"], trains["hours_below_floor"]) == (1, 0.5)
    assert trains["wall_seconds"] == 15.0
    assert trains["host_days_per_wall_second"] == pytest.approx(200 * 2 / 15, abs=0.05)
    assert trains["violations"] == 0
    assert trains["min_in_service"] == 159  # the fleet's lowest at once: 80 + 79 between 1.5 h and 2 h
    assert [row["name"] for row in summary["pools"]["trains"]] == ["sim-00", "sim-01"]
    assert summary["pools"]["trains"][0]["drains_per_host"] == pytest.approx(0.5)
    assert summary["pools"]["trains"][1]["min_in_service"] == 79
    assert summary["totals"]["rolling"]["drains_per_host"] == pytest.approx(1.5)
    assert summary["totals"]["rolling"]["offboardings"] == 2
    assert summary["totals"]["lockstep"]["host_days_per_wall_second"] is None  # no wall time measured


def test_fleet_in_service_sums_step_functions():
    pools = make_runs()["trains"][1]["pools"] + make_runs()["trains"][0]["pools"]
    assert fleet_in_service(pools, 48.0) == [(0.0, 200), (1.0, 180), (1.5, 159), (2.0, 179), (3.0, 200), (48.0, 200)]
    assert fleet_in_service([], 48.0) == []


def test_time_to_rollout_counts_unfinished_separately():
    trains = summarise(CONFIG, make_runs())["totals"]["trains"]
    assert (trains["rollouts"], trains["rollouts_finished"], trains["rollouts_unfinished"]) == (3, 2, 1)
    assert trains["rollout_mean_hours"] == pytest.approx(20.0)  # (10 + 30) / 2, not (10 + 30 + 0) / 3
    assert trains["rollout_worst_hours"] == pytest.approx(30.0)
    lockstep = summarise(CONFIG, make_runs())["totals"]["lockstep"]
    assert (lockstep["rollout_mean_hours"], lockstep["rollout_worst_hours"]) == (1.0, 1.0)


def test_cycles_and_the_lower_bound():
    summary = summarise(CONFIG, make_runs())
    trains = summary["totals"]["trains"]
    assert cycle_lower_bound_hours(CONFIG, 5) == 3.0  # ceil(5 / 2) visits of 60 minutes
    assert cycle_lower_bound_hours(SimulationConfig(planned_buffer_domains=1), 40) == 40.0
    assert cycle_lower_bound_hours(SimulationConfig(drain_minutes=0, planned_buffer_domains=3), 40) == 14 * 45 / 60
    assert trains["cycle_lower_bound_hours"] == 3.0
    assert trains["cycle_slo_hours"] == 24.0
    assert (trains["cycles"], trains["cycles_completed"]) == (3, 2)
    assert (trains["cycle_mean_hours"], trains["cycle_worst_hours"]) == (25.0, 30.0)
    assert trains["cycles_missed_slo"] == 2
    assert summary["pools"]["trains"][0]["cycles_missed_slo"] == 1
    rolling = summary["totals"]["rolling"]
    assert rolling["cycles"] is None
    assert rolling["cycle_lower_bound_hours"] is None
    assert rolling["cycle_mean_hours"] is None


def test_text_report_has_every_policy_and_fits_120_columns():
    text = report_text(summarise(CONFIG, make_runs()))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 120
    header = next(line for line in lines if "trains" in line and "rolling" in line)
    assert "lockstep" in header
    assert "400 hosts in 4 pools" in text
    assert "seed 1" in text
    assert "failed checks 0.20%" in text
    assert "drains per host" in text
    assert "20.0 / 30.0" in text  # time to full rollout, mean / worst
    assert "2 / 3" in text  # rollouts finished / total
    stranded = [" ".join(line.split()) for line in lines if "stranded" in line]
    assert stranded[:2] == [  # the policies side by side, next to the interrupted jobs (rolling's shards lack it)
        "interrupted jobs' stranded host-hours (drains) 180.8 — —",
        "interrupted jobs' stranded host-hours (failures) 3.0 — —",
    ]
    assert "trains (maintenance trains) per pool" in text
    assert "sim-01" in text


def test_text_report_wraps_many_pools_within_120_columns():
    many = [pool(f"pool-with-a-long-name-{i:03d}", drains=i) for i in range(30)]
    runs = {"rolling": [shard("rolling", many, violations=["x" * 300])]}
    text = report_text(summarise(CONFIG.replace(policies=("rolling",)), runs))
    assert max(len(line) for line in text.splitlines()) <= 120
    assert "(continued)" in text
    assert "INVARIANT VIOLATION (rolling)" in text


def test_markdown_table():
    table = report_markdown_table(summarise(CONFIG, make_runs()))
    lines = table.splitlines()
    assert lines[0].startswith("| measure | maintenance trains (`trains`) |")
    assert lines[1] == "|---|---:|---:|---:|"
    assert [line.split(" | ")[0][2:] for line in lines[2:]] == [
        "drains per host",
        "planned capacity-hours out",
        "failure capacity-hours out",
        "interrupted jobs",
        "interrupted jobs' stranded host-hours",
        "time to full rollout (mean / worst h)",
        "rollouts finished",
        "hosts reached per upgrade at 24 h / 72 h / 7 days (mean share)",
        "cycles completed (mean / worst h)",
        "cycles that missed a keepable SLO",
        "upgrades done by their first forecast",
        "done after that forecast (median / p90 h)",
        "host-cycles drained more than once",
        "hours below floor",
        "invariant violations",
    ]
    assert all(line.count("|") == 5 for line in lines)
    assert "| 0.40 | 1.50 | 1.00 |" in table
    assert "15 by drains, 1 by failures" in table
    assert "| interrupted jobs' stranded host-hours | 180.8 by drains, 3.0 by failures | — | — |" in table
    assert "| host-cycles drained more than once | 2 | — | — |" in table
    assert "| cycles completed (mean / worst h) | 2 (25.0 / 30.0) | — | — |" in table


def test_plots_are_well_formed_svg():
    svgs = plots(CONFIG, make_runs())
    assert set(svgs) == {"capacity.svg", "cycle_progress.svg", "gantt.svg", "rollouts.svg"}
    for text in svgs.values():
        assert ET.fromstring(text).tag == "{http://www.w3.org/2000/svg}svg"
    assert "floor 114 (summed over pools)" in svgs["capacity.svg"]
    assert "sim-00-d2" in svgs["gantt.svg"]
    assert "bar-skipped" in svgs["gantt.svg"]
    assert "bar-running" in svgs["gantt.svg"]
    assert "sim-00-d2, cycle 1 2.5-3.5 h, done" in svgs["gantt.svg"]
    assert "lock-step per pool" in svgs["rollouts.svg"]
    assert "trains" not in "".join(plots(CONFIG.replace(policies=("rolling",)), {"rolling": make_runs()["rolling"]}))


def test_html_report_contains_tables_and_svgs():
    runs = make_runs()
    svgs = plots(CONFIG, runs)
    html = report_html(summarise(CONFIG, runs), svgs)
    assert html.startswith("<!DOCTYPE html>")
    assert html.count("<svg") == len(svgs)
    for text in svgs.values():
        assert text.strip() in html  # inline and unescaped
    assert "Policies side by side" in html
    assert "drains per host" in html
    assert "maintenance trains" in html
    assert "Per pool" in html
    assert "<link" not in html
    assert "<script" not in html


def test_report_write_writes_every_file(tmp_path):
    runs = make_runs()
    written = report_write(tmp_path / "out" / "nested", CONFIG, runs)
    assert set(written) == {
        "report.txt",
        "report.html",
        "summary.json",
        "runs.json",
        "capacity.svg",
        "cycle_progress.svg",
        "gantt.svg",
        "rollouts.svg",
    }
    for name, path in written.items():
        assert path == tmp_path / "out" / "nested" / name
        assert path.read_text(encoding="utf-8")
    assert json.loads(written["summary.json"].read_text()) == summarise(CONFIG, runs)
    assert json.loads(written["runs.json"].read_text()) == runs
    assert written["report.txt"].read_text(encoding="utf-8") == report_text(summarise(CONFIG, runs))


@pytest.mark.parametrize(
    "runs",
    [
        {},
        {"trains": []},
        {"trains": [shard("trains", [])]},
        {"trains": [shard("trains", [pool("sim-00", hosts=0, samples=[], min_in_service=0)], wall=0)]},
        {"rolling": [{"policy": "rolling", "pools": [{"name": "sim-00"}]}]},
    ],
)
def test_missing_policies_and_empty_lists_do_not_crash(runs, tmp_path):
    summary = summarise(CONFIG, runs)
    assert summary["policies"][:3] == ["trains", "rolling", "lockstep"]
    assert summary["totals"]["lockstep"]["ran"] is False
    assert summary["totals"]["lockstep"]["drains_per_host"] is None
    text = report_text(summary)
    assert "not run" in text
    assert max(len(line) for line in text.splitlines()) <= 120
    assert "\u2014" in report_markdown_table(summary)
    written = report_write(tmp_path, CONFIG, runs)
    assert json.loads(written["summary.json"].read_text()) == summary
    for name, path in written.items():
        if name.endswith(".svg"):
            ET.fromstring(path.read_text())


def test_zero_hosts_has_no_drains_per_host():
    runs = {"trains": [shard("trains", [pool("sim-00", hosts=0, samples=[], min_in_service=0)])]}
    trains = summarise(CONFIG, runs)["totals"]["trains"]
    assert trains["drains_per_host"] is None
    assert trains["cycles_completed"] == 0
    assert trains["cycle_mean_hours"] is None
    assert trains["rollout_mean_hours"] is None

"""Forecasts of a live pool run in this process, on the test database, so each takes seconds: the
shards run here rather than in scratch lanes (each resets the test database, as a lane is, and
builds the pool from the snapshot)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleet.models import Pool
from simulation import from_live
from simulation.config import SimulationConfig
from simulation.engine import policy_run
from simulation.measure import run_measure
from simulation.report import summarise
from simulation.runner import Job
from simulation.world import workload_draw


def forecast(monkeypatch: pytest.MonkeyPatch, pool: Pool, *policies: str, days: float = 1) -> dict[str, Any]:
    """live_forecast_measures of a forecast of `pool` (one day by default), with its runs and summary."""

    def in_process(jobs: list[Job], lanes: list[str], work_dir: Path, **_: Any) -> dict[str, list[dict[str, Any]]]:
        runs: dict[str, list[dict[str, Any]]] = {}
        for job in jobs:
            log = policy_run(job.config, workload_draw(job.config), job.policy, pools=list(job.pools))
            runs.setdefault(job.key, []).append(run_measure(job.config, log))
        return runs

    monkeypatch.setattr(from_live, "jobs_run", in_process)
    monkeypatch.setattr(from_live, "scratch_databases", lambda lanes, tag="": ["in-process"] * lanes)
    monkeypatch.setattr(from_live, "scratch_databases_drop", lambda urls: None)
    monkeypatch.setattr(from_live, "scratch_databases_swept", lambda tags: [])
    base = SimulationConfig(days=days, policies=policies or ("trains",))
    result = from_live.live_forecast(base, pool.name, lanes=1, say=lambda _: None)
    return {"runs": result.runs, "summary": summarise(result.config, result.runs)} | from_live.live_forecast_measures(
        result
    )


def policy(result: dict[str, Any], name: str) -> dict[str, Any]:
    """One policy's part of a forecast's result."""
    return next(row for row in result["policies"] if row["policy"] == name)

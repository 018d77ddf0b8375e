"""Reliability (issue 8): the fault, stress and fuzz tests run, and their figures become the results
table of RELIABILITY.md.

python -m bench reliability [--seconds N]: empties var/reliability/, runs the tests below with
STRESS_SECONDS=N (300 without --seconds), reads the JSON lines the tests wrote there once their
assertions passed, and rewrites the table between the markers of RELIABILITY.md. Takes minutes.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import ROOT, Figure, scratch_database_url

FILES = [
    "tests/test_faults.py",
    "tests/test_stress.py",
    "tests/test_security.py",
    "tests/test_security_ui.py",
    "tests/test_scope_properties.py",
    "tests/test_form_fuzz.py",
]
FIGURES_DIR = ROOT / "var" / "reliability"
REPORT = ROOT / "RELIABILITY.md"
START, END = "<!-- reliability:start -->", "<!-- reliability:end -->"
DEFAULT_STRESS_SECONDS = 300
NOT_RUN = "not run"


@dataclass
class Outcomes:
    """Per test file: how many tests passed and failed (from pytest's JUnit XML)."""

    passed: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)


def run(seconds: float | None = None, *, files: list[str] | None = None, report: Path = REPORT) -> list[Figure]:
    stress_seconds = round(seconds) if seconds is not None else DEFAULT_STRESS_SECONDS
    files = files or FILES
    for old in FIGURES_DIR.glob("*.jsonl"):
        old.unlink()  # every figure in the table comes from this run
    outcomes = _pytest(files, stress_seconds)
    results = _read_figures()
    how = f"python -m bench reliability --seconds {stress_seconds} (pytest {' '.join(files)})"
    report.write_text(_rewrite(report, _table(results, outcomes, files, how)))
    print(f"bench reliability: table written to {report.name}", file=sys.stderr, flush=True)
    if sum(outcomes.failed.values()):
        raise SystemExit(f"bench reliability: tests failed (see {report.name}): {', '.join(outcomes.failures)}")
    return _figures(results, how)


# --- running the tests ----------------------------------------------------------------------------
def _pytest(files: list[str], stress_seconds: int) -> Outcomes:
    # pytest-django makes its test database next to this scratch one, so that a checkout running its
    # own suite meanwhile (test_<its database>) is never touched.
    env = dict(os.environ, DATABASE_URL=scratch_database_url("bench_reliability"), STRESS_SECONDS=str(stress_seconds))
    env.setdefault("DEBUG", "1")
    with tempfile.TemporaryDirectory() as work:
        junit = Path(work) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *files]
        print(f"bench reliability: {' '.join(command[2:])}", file=sys.stderr, flush=True)
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
        if not junit.exists():  # pytest did not get as far as running tests
            raise SystemExit(f"bench reliability: pytest exited {result.returncode}:\n{result.stdout[-4000:]}")
        return _outcomes(junit)


def _outcomes(junit: Path) -> Outcomes:
    outcomes = Outcomes()
    for case in ElementTree.parse(junit).iter("testcase"):
        # classname is tests.test_faults or tests.test_faults.TestWithSharedWorkers
        parts = (case.get("classname") or "").split(".")
        test_file = "/".join(part for part in parts if not part.startswith("Test")) + ".py"
        if case.find("skipped") is not None:
            continue
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes.failed[test_file] += 1
            outcomes.failures.append(f"{case.get('classname')}::{case.get('name')}")
        else:
            outcomes.passed[test_file] += 1
    return outcomes


# --- reading the figures --------------------------------------------------------------------------
def _read_figures() -> dict[str, list[dict]]:
    """{faults|stress|fuzz: lines}; a fault or surface written twice counts once (the last line)."""
    results: dict[str, list[dict]] = {}
    for name, key in (("faults", "fault"), ("stress", None), ("fuzz", "surface")):
        path = FIGURES_DIR / f"{name}.jsonl"
        if not path.exists():
            continue
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        results[name] = list({line[key]: line for line in lines}.values()) if key else lines[-1:]
    return results


def _figures(results: dict[str, list[dict]], how: str) -> list[Figure]:
    faults, stress, fuzz = results.get("faults", []), results.get("stress", []), results.get("fuzz", [])
    checks = sum(line.get("invariant_checks", 0) for line in [*faults, *stress])
    violations = sum(line.get("violations", 0) for line in [*faults, *stress])
    figures = [
        Figure("reliability_faults_survived", sum(bool(line.get("survived")) for line in faults), "faults", how),
        Figure("reliability_invariant_checks", checks, "checks", how),
        Figure("reliability_invariant_violations", violations, "violations", how),
        Figure("reliability_fuzz_cases", sum(line.get("cases", 0) for line in fuzz), "cases", how),
        Figure("reliability_fuzz_server_errors", sum(line.get("server_errors", 0) for line in fuzz), "errors", how),
    ]
    for line in stress:
        figures.append(Figure("reliability_stress_host_tasks", line["host_tasks"], "host tasks", how))
        figures.append(Figure("reliability_stress_operations", line["operations"], "operations", how))
    return figures


# --- the table ------------------------------------------------------------------------------------
def _table(results: dict[str, list[dict]], outcomes: Outcomes, files: list[str], how: str) -> str:
    faults, stress, fuzz = results.get("faults"), results.get("stress"), results.get("fuzz")
    stamp = f"{dt.date.today():%Y-%m-%d}, {platform.machine()}, {os.cpu_count()} cores"
    fuzzed = [line for line in fuzz or [] if "server_errors" in line] or None
    summary = [
        ("faults injected and survived", _faults_summary(faults, outcomes)),
        ("operations processed under stress", _stress_summary(stress)),
        ("invariant checks run (faults and stress)", _sum(faults, stress, key="invariant_checks")),
        ("invariant violations found", _sum(faults, stress, key="violations")),
        ("fuzz cases run", _sum(fuzz, key="cases")),
        ("server errors found by fuzzing", _sum(fuzzed, key="server_errors")),
        ("role matrices (UI, websocket)", _denied(fuzz)),
        ("tests", _tests_summary(outcomes)),
    ]
    lines = [f"Measured {stamp}, by `{how}`.", "", "| what | result |", "|---|---|"]
    lines += [f"| {what} | {value} |" for what, value in summary]
    lines += ["", "### Faults", ""]
    if faults:
        lines += [
            "| fault | survived | operations | host tasks | invariant checks | violations |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| `{line['fault']}` | {'yes' if line.get('survived') else 'no'} | {line.get('operations', '')} | "
            f"{line.get('host_tasks', '')} | {line.get('invariant_checks', '')} | {line.get('violations', '')} |"
            for line in faults
        ]
    else:
        lines.append(NOT_RUN + ("" if "tests/test_faults.py" in files else " (not among this run's test files)"))
    lines += ["", "### Fuzzing", ""]
    if fuzz:
        lines += ["| surface | cases | server errors | other outcomes |", "|---|---|---|---|"]
        for line in fuzz:
            other = ", ".join(
                f"{key.replace('_', ' ')} {value}"
                for key, value in line.items()
                if key not in ("surface", "cases", "server_errors")
            )
            lines.append(
                f"| {line['surface']} | {line.get('cases', '')} | {line.get('server_errors', '-')} | {other} |"
            )
    else:
        lines.append(NOT_RUN)
    return "\n".join(lines)


def _tests_summary(outcomes: Outcomes) -> str:
    failed = sum(outcomes.failed.values())
    text = f"{sum(outcomes.passed.values())} passed, {failed} failed"
    return text + (f": {', '.join(outcomes.failures)}" if failed else "")


def _faults_summary(faults: list[dict] | None, outcomes: Outcomes) -> str:
    if faults is None:
        return NOT_RUN
    survived = sum(bool(line.get("survived")) for line in faults)
    failed = outcomes.failed.get("tests/test_faults.py", 0)
    return f"{survived} of {len(faults) + failed}" + (f" ({failed} fault tests failed)" if failed else "")


def _stress_summary(stress: list[dict] | None) -> str:
    if not stress:
        return NOT_RUN
    line = stress[-1]
    return (
        f"{line['operations']} operations, {line['host_tasks']} host tasks by {line['processes']} processes "
        f"in {line['seconds']} s"
    )


def _sum(*groups: list[dict] | None, key: str) -> str:
    if all(lines is None for lines in groups):
        return NOT_RUN
    return str(sum(line.get(key, 0) for lines in groups for line in lines or []))


def _denied(fuzz: list[dict] | None) -> str:
    matrices = [line for line in fuzz or [] if "denied_as_expected" in line]
    if not matrices:
        return NOT_RUN
    denied, cases = (sum(line[key] for line in matrices) for key in ("denied_as_expected", "cases"))
    return f"{cases} cases, each allowed or refused as the matrix says ({denied} refusals)"


def _rewrite(report: Path, table: str) -> str:
    text = report.read_text() if report.exists() else f"# Reliability\n\n{START}\n{END}\n"
    if START not in text or END not in text:
        raise SystemExit(f"{report} has no {START} … {END} section to rewrite")
    before, rest = text.split(START, 1)
    return f"{before}{START}\n{table}\n{END}{rest.split(END, 1)[1]}"

"""serve's supervisor (config/supervisor.py) with real child processes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from config.supervisor import ChildSpec, RestartPolicy, Supervisor, TooManyCrashes, last_log_line

FAST = RestartPolicy(max_crashes=3, crash_window_s=60, backoff_initial_s=0.2, backoff_max_s=0.8)


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _run_until(supervisor: Supervisor, condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        supervisor.check()
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_a_child_that_dies_is_restarted_with_one_line_naming_it_its_code_and_its_last_log_line(
    tmp_path: Path,
) -> None:
    said: list[str] = []
    runs = tmp_path / "runs"
    # Dies on its first run with a last word in its log, then stays up.
    code = (
        "import pathlib, sys, time; p = pathlib.Path(sys.argv[1]); n = int(p.read_text() or 0) if p.exists() else 0; "
        "p.write_text(str(n + 1)); print('boom: disk on fire' if n == 0 else 'fine', flush=True); "
        "sys.exit(3) if n == 0 else time.sleep(60)"
    )
    spec = ChildSpec("worker", [*_python(code), str(runs)], tmp_path / "log" / "worker.log")
    supervisor = Supervisor([spec], say=said.append, policy=FAST)
    supervisor.start_all()
    try:
        _run_until(supervisor, lambda: runs.exists() and runs.read_text() == "2", timeout=20)
        assert supervisor.restarts == 1
        assert len(said) == 1
        assert said[0].startswith("worker exited with code 3: boom: disk on fire; restarting in 0.2 s (crash 1 of")
        assert str(spec.log) in said[0]
        assert "fine" in spec.log.read_text()  # the log is kept across restarts
    finally:
        supervisor.stop_all()


def test_the_back_off_schedule_doubles_and_is_capped(tmp_path: Path) -> None:
    now = [0.0]
    supervisor = Supervisor(
        [ChildSpec("web", _python("raise SystemExit(2)"), tmp_path / "web.log")],
        say=lambda line: None,
        policy=RestartPolicy(max_crashes=10, crash_window_s=600, backoff_initial_s=1, backoff_max_s=4),
        clock=lambda: now[0],
    )
    supervisor.start_all()
    child = supervisor.children[0]
    waits = []
    try:
        for _ in range(5):
            assert child.process is not None
            child.process.wait(timeout=10)
            supervisor.check()
            assert child.restart_at is not None
            waits.append(child.restart_at - now[0])
            now[0] = child.restart_at
            supervisor.check()  # restarts it
    finally:
        supervisor.stop_all()
    assert waits == [1, 2, 4, 4, 4]


def test_repeated_crashes_stop_the_product_with_the_reason(tmp_path: Path) -> None:
    supervisor = Supervisor(
        [
            ChildSpec("worker", _python("print('cannot connect to broker'); raise SystemExit(1)"), tmp_path / "w.log"),
            ChildSpec("web", _python("import time; time.sleep(60)"), tmp_path / "web.log"),
        ],
        say=lambda line: None,
        policy=FAST,
    )
    supervisor.start_all()
    web = supervisor.children[1].process
    try:
        with pytest.raises(TooManyCrashes) as stopped:
            _run_until(supervisor, lambda: False, timeout=30)
    finally:
        supervisor.stop_all()
    assert str(stopped.value).startswith("worker exited with code 1: cannot connect to broker (crash 4 within 1 min")
    assert web is not None
    assert web.poll() is not None  # stop_all stopped the healthy child too


def test_crashes_older_than_the_window_are_forgiven(tmp_path: Path) -> None:
    now = [0.0]
    supervisor = Supervisor(
        [ChildSpec("beat", _python("raise SystemExit(1)"), tmp_path / "b.log")],
        say=lambda line: None,
        policy=RestartPolicy(max_crashes=2, crash_window_s=100, backoff_initial_s=1, backoff_max_s=1),
        clock=lambda: now[0],
    )
    supervisor.start_all()
    child = supervisor.children[0]
    try:
        for _ in range(6):  # six crashes, each 60 s apart: never more than two within 100 s
            assert child.process is not None
            child.process.wait(timeout=10)
            supervisor.check()
            now[0] += 60
            supervisor.check()
    finally:
        supervisor.stop_all()
    assert supervisor.restarts == 6


def test_last_log_line_is_the_last_non_empty_line(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    assert last_log_line(log) == ""
    log.write_text("first\nsecond\n\n  \n")
    assert last_log_line(log) == "second"

"""A failed shard's own error reaches its one-line message (ShardFailed), however late the runner's relay
of the shard's standard error gets to it, and nothing the shard leaves behind holds the runner."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from simulation import runner

LAST = "CommandError: the shard's own error"


def ended_shard(before: str = "") -> subprocess.Popen[bytes]:
    """A shard's process that ran `before`, wrote its error as its last line and failed."""
    code = f"{before}\nimport sys\nsys.stderr.write({LAST!r} + '\\n')\nsys.exit(1)"
    shard = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    shard.wait()
    return shard


class LateLines:
    """A pipe whose lines the relay gets `seconds` late, as a starved thread on a loaded machine would."""

    def __init__(self, pipe: Iterator[bytes], seconds: float) -> None:
        self.pipe, self.seconds = pipe, seconds

    def __iter__(self) -> Iterator[bytes]:
        for line in self.pipe:
            time.sleep(self.seconds)
            yield line


class SlowStderr:
    """Our standard error taking `seconds` for each line (a file under I/O pressure, a slow log reader)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def write(self, text: str) -> int:
        time.sleep(self.seconds)
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.slow
def test_a_failed_shards_last_line_is_kept_when_the_relay_reaches_it_seconds_after_the_shard_ended() -> None:
    shard = ended_shard()
    shard.stderr = LateLines(shard.stderr, seconds=6)  # type: ignore[assignment]  # past the old 5 s wait

    assert runner._StderrRelay(shard).last_line() == LAST


def test_a_failed_shards_last_line_is_kept_while_our_stderr_is_slow_to_take_it(monkeypatch) -> None:
    monkeypatch.setattr(runner, "RELAY_DRAIN_SECONDS", 0.5)
    shard = ended_shard()
    monkeypatch.setattr(sys, "stderr", SlowStderr(seconds=6))

    assert runner._StderrRelay(shard).last_line() == LAST


def test_a_grandchild_holding_a_failed_shards_stderr_open_costs_the_wait_bound_not_a_hang(monkeypatch) -> None:
    monkeypatch.setattr(runner, "RELAY_DRAIN_SECONDS", 0.5)
    shard = ended_shard("import subprocess\nprint(subprocess.Popen(['sleep', '60']).pid, flush=True)")
    grandchild = int(shard.stdout.readline()) if shard.stdout else 0
    try:
        started = time.monotonic()
        last = runner._StderrRelay(shard).last_line()
        waited = time.monotonic() - started
    finally:
        os.kill(grandchild, signal.SIGKILL)

    assert last == LAST
    assert waited < 3  # the bound, not until the grandchild ends

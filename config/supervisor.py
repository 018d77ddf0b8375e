"""Keep `serve`'s children running: a child that dies is restarted after a back-off, with one line
that says which, how and where its log is; only repeated crashes stop the product.

Each child writes to its own log file (`var/log/<name>.log`), so the terminal shows what an operator
needs (the banner, restarts) and not Celery's line per task.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

STOP_GRACE_SECONDS = 10
LOG_ROTATE_BYTES = 20 * 1024 * 1024
LAST_LINE_BYTES = 4096


@dataclass(frozen=True)
class ChildSpec:
    name: str
    command: Sequence[str]
    log: Path


@dataclass(frozen=True)
class RestartPolicy:
    max_crashes: int = 5  # within crash_window_s; one more stops the product
    crash_window_s: float = 600.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0


@dataclass
class _Child:
    spec: ChildSpec
    process: subprocess.Popen | None = None
    crashes: deque[float] = field(default_factory=deque)
    restart_at: float | None = None


class TooManyCrashes(Exception):
    """A child crashed more often than the policy allows; the message says which and how often."""


def last_log_line(path: Path) -> str:
    """The last non-empty line of a log, for the one-line crash message."""
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(log.tell() - LAST_LINE_BYTES, 0))
            lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


class Supervisor:
    def __init__(
        self,
        specs: Sequence[ChildSpec],
        *,
        say: Callable[[str], None],
        env: dict[str, str] | None = None,
        policy: RestartPolicy = RestartPolicy(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.children = [_Child(spec) for spec in specs]
        self.say = say
        self.env = env if env is not None else dict(os.environ)
        self.policy = policy
        self.clock = clock
        self.restarts = 0

    def start_all(self) -> None:
        for child in self.children:
            self._start(child)

    def check(self) -> None:
        """Restart what died (after its back-off); raise TooManyCrashes when the policy says stop."""
        now = self.clock()
        for child in self.children:
            if child.process is not None and child.process.poll() is not None:
                self._crashed(child, now)
            if child.process is None and child.restart_at is not None and now >= child.restart_at:
                self.restarts += 1
                self._start(child)

    def stop_all(self) -> None:
        running = [child.process for child in self.children if child.process and child.process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for process in running:
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _start(self, child: _Child) -> None:
        spec = child.spec
        spec.log.parent.mkdir(parents=True, exist_ok=True)
        if spec.log.exists() and spec.log.stat().st_size > LOG_ROTATE_BYTES:
            spec.log.replace(spec.log.with_suffix(spec.log.suffix + ".1"))
        with spec.log.open("ab") as sink:
            # Its own session: Ctrl-C reaches serve only, which stops the children in order.
            child.process = subprocess.Popen(
                list(spec.command), env=self.env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
            )
        child.restart_at = None

    def _crashed(self, child: _Child, now: float) -> None:
        assert child.process is not None
        code = child.process.returncode
        child.process = None
        child.crashes.append(now)
        while child.crashes and child.crashes[0] < now - self.policy.crash_window_s:
            child.crashes.popleft()
        recent = len(child.crashes)
        last = last_log_line(child.spec.log)
        why = f"{child.spec.name} exited with code {code}" + (f": {last}" if last else "")
        if recent > self.policy.max_crashes:
            raise TooManyCrashes(
                f"{why} (crash {recent} within {self.policy.crash_window_s / 60:.0f} min; log: {child.spec.log})"
            )
        delay = min(self.policy.backoff_initial_s * 2 ** (recent - 1), self.policy.backoff_max_s)
        child.restart_at = now + delay
        self.say(
            f"{why}; restarting in {delay:g} s (crash {recent} of at most {self.policy.max_crashes} "
            f"within {self.policy.crash_window_s / 60:.0f} min; log: {child.spec.log})"
        )

"""Progress lines for long commands (seeding, later the simulator): what, how far, how long."""

from __future__ import annotations

import sys
import time
from typing import Protocol


class Stream(Protocol):
    """Where progress lines go: a text file, or a management command's stdout or stderr."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


class Progress:
    """Prints "label: done/total (pct) elapsed" at most every `interval` seconds, and always at the end."""

    def __init__(self, label: str, *, stream: Stream | None = None, interval: float = 1.0) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.interval = interval
        self.started = time.monotonic()
        self._last_print = 0.0

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def update(self, step: str, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last_print < self.interval:
            return
        self._last_print = now
        percent = 100.0 * done / total if total else 100.0
        self.stream.write(f"{self.label}: {step} {done:,}/{total:,} ({percent:.0f}%) {self.elapsed():.1f}s\n")
        self.stream.flush()

    def note(self, message: str) -> None:
        self.stream.write(f"{self.label}: {message} {self.elapsed():.1f}s\n")
        self.stream.flush()

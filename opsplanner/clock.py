"""The one clock. Scheduling code calls now() so a simulation can run the same code in virtual time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.utils import timezone

_source: Callable[[], dt.datetime] = timezone.now


def now() -> dt.datetime:
    """The current time, always timezone-aware (UTC)."""
    return _source()


@contextmanager
def use_clock(source: Callable[[], dt.datetime]) -> Iterator[None]:
    """Run a block with another time source (a virtual clock in the simulator and in tests)."""
    global _source
    previous = _source
    _source = source
    try:
        yield
    finally:
        _source = previous

"""The SVG time line shared by the Gantt page (`gantt/svg.py`) and the simulation report's charts
(`simulation/plots.py`): text and numbers as SVG takes them, a linear scale from time (or any
quantity) to pixels, an axis's ticks, and the bar a span of time draws. Dependency-free, so the
simulator's report can use it without Django."""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass

SVG_NS = "http://www.w3.org/2000/svg"
_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def esc(value: object) -> str:
    """Text safe inside XML content and double-quoted attributes (characters XML cannot hold become U+FFFD)."""
    text = _INVALID_XML.sub("\ufffd", str(value))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def coordinate(value: float) -> str:
    """A coordinate with at most two decimals and no '-0'."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


@dataclass(frozen=True)
class Scale:
    """Maps values from lo to hi onto pixels from `start` over `length` (hi may be below lo: an
    upward y axis); with clamp, values outside stay on the edges."""

    lo: float
    hi: float
    start: float
    length: float
    clamp: bool = False

    def __call__(self, value: float) -> float:
        fraction = (value - self.lo) / (self.hi - self.lo)
        if self.clamp:
            fraction = min(1.0, max(0.0, fraction))
        return self.start + fraction * self.length


@dataclass(frozen=True)
class Tick:
    at: float  # in the scale's units
    label: str


def nice_ticks(lo: float, hi: float, *, outward: bool) -> list[Tick]:
    """4-8 'nice' ticks (1, 2 or 5 x 10^k apart), labelled with as many decimals as the step needs.

    Outward ticks cover [lo, hi] (the first at or below lo, the last at or above hi); inward ticks lie inside it.
    """
    base = 10.0 ** math.floor(math.log10((hi - lo) / 8))
    best: tuple[float, float, int, int] | None = None
    for step in (m * base * 10**k for k in range(3) for m in (1, 2, 5)):
        if outward:
            first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
        else:
            first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
        count = last - first + 1
        penalty = (0 if 4 <= count <= 8 else 10 * min(abs(count - 4), abs(count - 8))) + abs(count - 6)
        if best is None or penalty < best[0]:
            best = (penalty, step, first, last)
    assert best is not None
    _, step, first, last = best
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    values = [round(k * step, decimals) for k in range(first, last + 1)]
    return [Tick(value, _number_label(value, decimals)) for value in values]


def _number_label(value: float, decimals: int) -> str:
    text = f"{value:.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def _calendar_step(span: dt.timedelta) -> tuple[dt.timedelta, str]:
    if span <= dt.timedelta(hours=2):
        return dt.timedelta(minutes=10), "%H:%M"
    if span <= dt.timedelta(hours=12):
        return dt.timedelta(hours=1), "%H:%M"
    if span <= dt.timedelta(days=2):
        return dt.timedelta(hours=6), "%a %H:%M"
    if span <= dt.timedelta(days=10):
        return dt.timedelta(days=1), "%a %d %b"
    return dt.timedelta(days=7), "%d %b"


def calendar_ticks(start: dt.datetime, end: dt.datetime) -> list[Tick]:
    """Ticks on whole steps of the clock (midnight for days) from start to before end, at seconds
    after start, labelled as the span calls for (times of day, weekdays, dates)."""
    step, fmt = _calendar_step(end - start)
    tick = start.replace(minute=0, second=0, microsecond=0)
    if step >= dt.timedelta(days=1):
        tick = tick.replace(hour=0)
    while tick < start:
        tick += step
    ticks = []
    while tick < end:
        ticks.append(Tick((tick - start).total_seconds(), f"{tick:{fmt}}"))
        tick += step
    return ticks


def bar_rect(
    *, css: str, x1: float, x2: float, y: float, height: float, title: str, min_width: float, attrs: str = ""
) -> str:
    """A span from x1 to x2 as a rectangle at least min_width wide (a short span stays visible),
    with its title as tooltip; attrs are further attributes (a fill, rounded corners)."""
    return (
        f'<rect class="{css}" x="{coordinate(x1)}" y="{coordinate(y)}" width="{coordinate(max(x2 - x1, min_width))}" '
        f'height="{coordinate(height)}"{attrs}><title>{esc(title)}</title></rect>'
    )

"""Drawing the Gantt as SVG: a time axis, then one <g id="gantt-row-…"> per row, so a live update
replaces one row's contents alone (the rows' positions stay where the page drew them)."""

from __future__ import annotations

import datetime as dt
from urllib.parse import urlencode

from django.utils.html import escape

from opsplanner.gantt.rows import Bar, Gantt, Row

SVG_NS = "http://www.w3.org/2000/svg"
WIDTH = 1200
LABEL_WIDTH = 210
CHART_WIDTH = WIDTH - LABEL_WIDTH - 10
AXIS_HEIGHT = 34
ROW_HEIGHT = {0: 22, 1: 26, 2: 20}
LANE_HEIGHT = {0: 0.55, 1: 0.35}  # share of the row: visits above, operations below


def _ticks(start: dt.datetime, end: dt.datetime) -> tuple[dt.timedelta, str]:
    span = end - start
    if span <= dt.timedelta(hours=2):
        return dt.timedelta(minutes=10), "%H:%M"
    if span <= dt.timedelta(hours=12):
        return dt.timedelta(hours=1), "%H:%M"
    if span <= dt.timedelta(days=2):
        return dt.timedelta(hours=6), "%a %H:%M"
    if span <= dt.timedelta(days=10):
        return dt.timedelta(days=1), "%a %d %b"
    return dt.timedelta(days=7), "%d %b"


class _Scale:
    def __init__(self, start: dt.datetime, end: dt.datetime) -> None:
        self.start = start
        self.seconds = (end - start).total_seconds()

    def x(self, moment: dt.datetime) -> float:
        fraction = (moment - self.start).total_seconds() / self.seconds
        return LABEL_WIDTH + min(1.0, max(0.0, fraction)) * CHART_WIDTH


def row_height(row: Row) -> int:
    return ROW_HEIGHT[row.level]


def render_axis(gantt: Gantt) -> str:
    params, scale = gantt.params, _Scale(gantt.params.start, gantt.params.end)
    step, fmt = _ticks(params.start, params.end)
    # First tick on a whole step (midnight for days) after the start.
    first = params.start.replace(minute=0, second=0, microsecond=0)
    if step >= dt.timedelta(days=1):
        first = first.replace(hour=0)
    while first < params.start:
        first += step
    parts = ['<g id="gantt-axis" class="axis">']
    tick = first
    while tick < params.end:
        x = scale.x(tick)
        parts.append(
            f'<line x1="{x:.1f}" y1="{AXIS_HEIGHT - 8}" x2="{x:.1f}" y2="100%" class="tick"/>'
            f'<text x="{x + 3:.1f}" y="{AXIS_HEIGHT - 12}">{tick:{fmt}}</text>'
        )
        tick += step
    parts.append("</g>")
    return "".join(parts)


def render_now(gantt: Gantt) -> str:
    """The now line (the inside of its own group, so a live update moves it)."""
    if not gantt.params.start <= gantt.now <= gantt.params.end:
        return ""
    x = _Scale(gantt.params.start, gantt.params.end).x(gantt.now)
    return (
        f'<line x1="{x:.1f}" y1="{AXIS_HEIGHT - 10}" x2="{x:.1f}" y2="100%" class="now"/>'
        f'<text x="{x + 3:.1f}" y="{AXIS_HEIGHT - 1}" class="now-label">now {gantt.now:%H:%M} UTC</text>'
    )


def render_row_contents(gantt: Gantt, row: Row) -> str:
    """Everything inside one row's group, in row coordinates (y from 0)."""
    scale, height = _Scale(gantt.params.start, gantt.params.end), row_height(row)
    parts = [f'<rect class="row-bg level-{row.level}" x="0" y="0" width="{WIDTH}" height="{height}"/>']
    for band in row.bands:
        x1, x2 = scale.x(band.start), scale.x(band.end)
        parts.append(
            f'<rect class="band {band.css}" x="{x1:.1f}" y="0" width="{max(x2 - x1, 1):.1f}" height="{height}">'
            f"<title>{escape(band.title)}</title></rect>"
        )
    parts.append(_label(gantt, row, height))
    for bar in row.bars:
        parts.append(_bar(scale, bar, height))
    return "".join(parts)


def _label(gantt: Gantt, row: Row, height: int) -> str:
    indent = {0: 4, 1: 14, 2: 30}[row.level]
    text = escape(row.label)
    y = height / 2 + 4
    if row.level == 1 and row.domain_id is not None and gantt.params.host is None:
        expand = set(gantt.params.expand) ^ {row.domain_id}
        href = "?" + urlencode(gantt.params.query(expand=frozenset(expand)))
        sign = "\u2212" if row.expanded else "+"
        what = "collapse" if row.expanded else "expand to hosts"
        return (
            f'<a href="{escape(href)}" class="toggle" aria-label="{what} {text}">'
            f'<text x="{indent}" y="{y:.1f}" class="label level-1">{sign} {text}</text></a>'
        )
    label = f'<text x="{indent}" y="{y:.1f}" class="label level-{row.level}">{text}</text>'
    return f'<a href="{escape(row.href)}">{label}</a>' if row.href else label


def _bar(scale: _Scale, bar: Bar, height: int) -> str:
    x1, x2 = scale.x(bar.start), scale.x(bar.end)
    if bar.lane == 0:
        y, h = 2, height * LANE_HEIGHT[0]
    else:
        y, h = height * (1 - LANE_HEIGHT[1]) - 2, height * LANE_HEIGHT[1]
    return (
        f'<rect class="bar {bar.css}" x="{x1:.1f}" y="{y:.1f}" width="{max(x2 - x1, 2):.1f}" height="{h:.1f}" rx="2">'
        f"<title>{escape(bar.title)}</title></rect>"
    )


def render_svg(gantt: Gantt) -> str:
    """The whole chart."""
    y = AXIS_HEIGHT
    rows = []
    for row in gantt.rows:
        rows.append(
            f'<g id="gantt-row-{row.key}" class="row level-{row.level}" transform="translate(0,{y})">'
            f"{render_row_contents(gantt, row)}</g>"
        )
        y += row_height(row)
    height = y + 4
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="gantt" viewBox="0 0 {WIDTH} {height}" '
        f'width="{WIDTH}" height="{height}" role="img" aria-label="Gantt of visits and host tasks">'
        f'{render_axis(gantt)}{"".join(rows)}<g id="gantt-now">{render_now(gantt)}</g></svg>'
    )


def render_live_rows(gantt: Gantt) -> str:
    """Out-of-band swaps for a websocket push: each row's contents, and the now line. Each piece is
    wrapped in an <svg> so the browser parses it as SVG; htmx swaps the wrapper's children into
    the row's group (innerHTML), which keeps the group's position."""
    parts = [
        f'<svg xmlns="{SVG_NS}" hx-swap-oob="innerHTML:#gantt-row-{row.key}">{render_row_contents(gantt, row)}</svg>'
        for row in gantt.rows
    ]
    parts.append(
        f'<svg xmlns="http://www.w3.org/2000/svg" hx-swap-oob="innerHTML:#gantt-now">{render_now(gantt)}</svg>'
    )
    return "".join(parts)

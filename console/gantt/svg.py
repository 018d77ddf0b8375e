"""Drawing the Gantt as SVG: a time axis, then one <g id="gantt-row-…"> per row, so a live update
replaces one row's contents alone (the rows' positions stay where the page drew them)."""

from __future__ import annotations

import datetime as dt
from urllib.parse import urlencode

from django.utils.html import escape

from console.gantt.rows import Bar, Gantt, Mark, Row
from drawing.timeline import SVG_NS, Scale, bar_rect, calendar_ticks, coordinate, esc

WIDTH = 1200
LABEL_WIDTH = 210
CHART_WIDTH = WIDTH - LABEL_WIDTH - 10
AXIS_HEIGHT = 34
ROW_HEIGHT = {0: 22, 1: 26, 2: 20}
LANE_HEIGHT = {0: 0.55, 1: 0.35}  # share of the row: visits above, operations below


class _TimeAxis:
    """The window's moments as x positions: the shared scale over seconds after the start, clamped
    so that bars running past either edge stop at it."""

    def __init__(self, start: dt.datetime, end: dt.datetime) -> None:
        self.start = start
        self.scale = Scale(0.0, (end - start).total_seconds(), LABEL_WIDTH, CHART_WIDTH, clamp=True)

    def x(self, moment: dt.datetime) -> float:
        return self.scale((moment - self.start).total_seconds())


def row_height(row: Row) -> int:
    return ROW_HEIGHT[row.level]


def render_axis(gantt: Gantt) -> str:
    params = gantt.params
    axis = _TimeAxis(params.start, params.end)
    parts = ['<g id="gantt-axis" class="axis">']
    for tick in calendar_ticks(params.start, params.end):
        x = axis.scale(tick.at)
        parts.append(
            f'<line x1="{x:.1f}" y1="{AXIS_HEIGHT - 8}" x2="{x:.1f}" y2="100%" class="tick"/>'
            f'<text x="{x + 3:.1f}" y="{AXIS_HEIGHT - 12}">{esc(tick.label)}</text>'
        )
    parts.append("</g>")
    return "".join(parts)


def render_now(gantt: Gantt) -> str:
    """The now line (the inside of its own group, so a live update moves it)."""
    if not gantt.params.start <= gantt.now <= gantt.params.end:
        return ""
    x = _TimeAxis(gantt.params.start, gantt.params.end).x(gantt.now)
    return (
        f'<line x1="{x:.1f}" y1="{AXIS_HEIGHT - 10}" x2="{x:.1f}" y2="100%" class="now"/>'
        f'<text x="{x + 3:.1f}" y="{AXIS_HEIGHT - 1}" class="now-label">now {gantt.now:%H:%M} UTC</text>'
    )


def render_row_contents(gantt: Gantt, row: Row) -> str:
    """Everything inside one row's group, in row coordinates (y from 0)."""
    axis, height = _TimeAxis(gantt.params.start, gantt.params.end), row_height(row)
    parts = [f'<rect class="row-bg level-{row.level}" x="0" y="0" width="{WIDTH}" height="{height}"/>']
    for band in row.bands:
        parts.append(
            bar_rect(
                css=f"band {band.css}",
                x1=axis.x(band.start),
                x2=axis.x(band.end),
                y=0,
                height=height,
                title=band.title,
                min_width=1,
            )
        )
    parts.append(_label(gantt, row, height))
    for bar in row.bars:
        parts.append(_bar(axis, bar, height))
    for mark in row.marks:
        parts.append(_mark(axis, mark, height))
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


def _bar(axis: _TimeAxis, bar: Bar, height: int) -> str:
    if bar.lane == 0:
        y, h = 2.0, height * LANE_HEIGHT[0]
    else:
        y, h = height * (1 - LANE_HEIGHT[1]) - 2, height * LANE_HEIGHT[1]
    x1, x2 = axis.x(bar.start), axis.x(bar.end)
    return bar_rect(css=f"bar {bar.css}", x1=x1, x2=x2, y=y, height=h, title=bar.title, min_width=2, attrs=' rx="2"')


def _mark(axis: _TimeAxis, mark: Mark, height: int) -> str:
    """A diamond at the mark's moment across the row's middle, its title as tooltip."""
    x, y, r = axis.x(mark.at), height / 2, height * 0.3
    corners = ((x, y - r), (x + r, y), (x, y + r), (x - r, y))
    points = " ".join(f"{coordinate(px)},{coordinate(py)}" for px, py in corners)
    shape = f'<polygon class="mark {mark.css}" points="{points}"><title>{esc(mark.title)}</title></polygon>'
    return f'<a href="{esc(mark.href)}">{shape}</a>' if mark.href else shape


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
        f'<svg xmlns="{SVG_NS}" class="gantt" viewBox="0 0 {WIDTH} {height}" '
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
    parts.append(f'<svg xmlns="{SVG_NS}" hx-swap-oob="innerHTML:#gantt-now">{render_now(gantt)}</svg>')
    return "".join(parts)

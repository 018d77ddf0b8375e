"""Dependency-free SVG charts for the simulation report and the dashboard: line charts and a Gantt.

Each function returns a complete, self-contained ``<svg>`` document (no XML declaration, so it can be
embedded inline in HTML as well as written to a .svg file). The output uses no ids and no <style> block,
so several charts can share one page, and it is deterministic: the same input gives byte-identical text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from drawing.timeline import SVG_NS, Scale, Tick, bar_rect, nice_ticks
from drawing.timeline import coordinate as _num  # short: SVG text is full of them
from drawing.timeline import esc as _esc

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
STATE_COLOURS = {"done": "#2ca02c", "failed": "#d62728", "skipped": "#9e9e9e", "running": "#1f77b4"}
OTHER_STATE_COLOUR = "#8c564b"
MARK_COLOUR = "#ffd400"
MAX_POINTS = 1500  # a series longer than this is decimated, keeping each bucket's min and max
CHAR_WIDTH = 6.5  # rough width of one character at the 11px label font, for layout only
DASH = "6 4"


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]  # (x, y); x ascending
    step: bool = False  # draw as a step function (value holds until the next point)
    dashed: bool = False


@dataclass(frozen=True)
class HLine:
    name: str
    y: float
    dashed: bool = True


@dataclass(frozen=True)
class Bar:
    row: str
    start: float
    end: float
    state: str = "done"  # done | failed | skipped | running : picks the colour
    label: str = ""  # tooltip (<title>)


def _usable(value: float) -> bool:
    return math.isfinite(value) and abs(value) < 1e300


def _clean(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    pairs = [(float(x), float(y)) for x, y in points]
    return sorted(((x, y) for x, y in pairs if _usable(x) and _usable(y)), key=lambda point: point[0])


def _decimate(points: list[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most `limit` points: the first and last, and the lowest and highest of each bucket between, in order."""
    if len(points) <= limit:
        return points
    inner = points[1:-1]
    buckets = (limit - 2) // 2
    size = len(inner) / buckets
    kept = [points[0]]
    for bucket in range(buckets):
        chunk = inner[int(bucket * size) : int((bucket + 1) * size)]
        if not chunk:
            continue
        ys = [y for _, y in chunk]
        low = min(range(len(chunk)), key=ys.__getitem__)
        high = max(range(len(chunk)), key=ys.__getitem__)
        kept.extend(chunk[index] for index in sorted({low, high}))
    kept.append(points[-1])
    return kept


def _expand(lo: float, hi: float, *, upward_only: bool = False) -> tuple[float, float]:
    """A non-empty range around a single value, so scaling never divides by zero."""
    if hi - lo > 1e-9 * max(1.0, abs(lo), abs(hi)):
        return lo, hi
    pad = abs(hi) * 0.1 or 1.0
    return (lo, hi + 2 * pad) if upward_only else (lo - pad, hi + pad)


def _text(x: float, y: float, text: str, *, cls: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text class="{cls}" x="{_num(x)}" y="{_num(y)}" text-anchor="{anchor}"{extra}>{_esc(text)}</text>'


def _legend(items: list[tuple[str, str, bool, str]], *, y0: float, width: int) -> tuple[str, float]:
    """Legend entries (name, colour, dashed, swatch kind 'line' or 'box') wrapped into rows; returns svg, height."""
    if not items:
        return "", 0.0
    parts, x, y = ['<g class="legend">'], 16.0, y0
    for name, colour, dashed, kind in items:
        item_width = 26 + len(name) * CHAR_WIDTH + 14
        if x > 16 and x + item_width > width - 16:
            x, y = 16.0, y + 16
        if kind == "box":
            swatch = f'<rect x="{_num(x)}" y="{_num(y - 8)}" width="18" height="9" fill="{colour}"/>'
        else:
            dash = f' stroke-dasharray="{DASH}"' if dashed else ""
            swatch = (
                f'<line x1="{_num(x)}" y1="{_num(y - 4)}" x2="{_num(x + 18)}" y2="{_num(y - 4)}" '
                f'stroke="{colour}" stroke-width="2"{dash}/>'
            )
        parts.append(f'<g class="legend-item">{swatch}{_text(x + 24, y, name, cls="legend-label")}</g>')
        x += item_width
    parts.append("</g>")
    return "".join(parts), y - y0 + 16


def _document(title: str, width: int, height: float, body: list[str]) -> str:
    head = (
        f'<svg xmlns="{SVG_NS}" viewBox="0 0 {width} {_num(height)}" width="{width}" height="{_num(height)}" '
        f'role="img" aria-label="{_esc(title)}" font-family="sans-serif" font-size="11" fill="#222">'
        f"<title>{_esc(title)}</title>"
        f'<rect class="background" x="0" y="0" width="{width}" height="{_num(height)}" fill="#fff"/>'
        + _text(width / 2, 20, title, cls="chart-title", anchor="middle", extra=' font-size="14" font-weight="bold"')
    )
    return head + "".join(body) + "</svg>\n"


def _no_data(title: str, width: int, height: float, legend: str, top: float, note: str = "") -> str:
    """The frame of a chart with nothing to plot, saying so."""
    body = [
        legend,
        f'<rect class="frame" x="16" y="{_num(top)}" width="{width - 32}" height="{_num(height - top - 16)}" '
        'fill="none" stroke="#ccc"/>',
        _text(width / 2, (top + height - 16) / 2 + 4, "no data", cls="no-data", anchor="middle", extra=' fill="#888"'),
    ]
    if note:
        body.append(_text(width / 2, height - 4, note, cls="note", anchor="middle", extra=' fill="#666"'))
    return _document(title, width, height, body)


def _path(points: list[tuple[float, float]], *, step: bool) -> str:
    commands: list[str] = []
    for index, (x, y) in enumerate(points):
        if index and step:
            commands.append(f"L{_num(x)} {_num(points[index - 1][1])}")
        commands.append(f"{'L' if index else 'M'}{_num(x)} {_num(y)}")
    return " ".join(commands)


def _x_axis(ticks: list[Tick], px: Scale, box: tuple[float, ...]) -> list[str]:
    """Vertical grid lines with labels below the plot, then the two axis lines; box is (left, top, right, bottom)."""
    left, top, right, bottom = box
    parts = []
    for tick in ticks:
        x = _num(px(tick.at))
        grid = f'<line x1="{x}" x2="{x}" y1="{_num(top)}" y2="{_num(bottom)}" stroke="#ddd"/>'
        text = _text(px(tick.at), bottom + 15, tick.label, cls="tick-label", anchor="middle")
        parts.append(f'<g class="x-tick">{grid}{text}</g>')
    parts.append(
        f'<path class="axis" d="M{_num(left)} {_num(top)} V{_num(bottom)} H{_num(right)}" fill="none" stroke="#444"/>'
    )
    return parts


@dataclass(frozen=True)
class _LinePlot:
    """Where a line chart draws: its plot area and the two scales into it."""

    left: float
    top: float
    width: float
    height: float
    px: Scale
    py: Scale
    x_ticks: list[Tick]
    y_ticks: list[Tick]

    @property
    def right(self) -> float:
        return self.left + self.width

    @property
    def bottom(self) -> float:
        return self.top + self.height


def line_chart(
    *,
    title: str,
    series: Sequence[Series],
    x_label: str,
    y_label: str,
    hlines: Sequence[HLine] = (),
    mark: tuple[float, float] | None = None,
    mark_label: str = "",
    width: int = 860,
    height: int = 320,
    y_min: float | None = None,
) -> str:
    """Lines (optionally stepped or dashed) over a shared x axis, with horizontal reference lines and one mark."""
    width, height = max(int(width), 240), max(int(height), 160)
    cleaned = [_decimate(_clean(s.points)) for s in series]
    lines = [h for h in hlines if _usable(float(h.y))]
    if mark is not None and not (_usable(float(mark[0])) and _usable(float(mark[1]))):
        mark = None
    items = [
        (s.name if points else f"{s.name} (no data)", PALETTE[i % len(PALETTE)], s.dashed, "line")
        for i, (s, points) in enumerate(zip(series, cleaned, strict=True))
    ]
    items += [(h.name, PALETTE[(len(series) + i) % len(PALETTE)], h.dashed, "line") for i, h in enumerate(hlines)]
    legend, legend_height = _legend(items, y0=38, width=width)
    top = 38 + legend_height + 4
    height = max(height, int(top) + 120)
    xs = [x for points in cleaned for x, _ in points]
    ys = [y for points in cleaned for _, y in points]
    if not xs:
        return _no_data(title, width, height, legend, top)

    ys += [float(h.y) for h in lines]
    if mark is not None:
        xs.append(float(mark[0]))
        ys.append(float(mark[1]))
    plot = _line_plot(xs, ys, y_min=y_min, top=top, width=width, height=height)
    body = [legend, '<g class="axes">', *_y_axis(plot), *_x_axis(plot.x_ticks, plot.px, _box(plot)), "</g>"]
    body += _hlines(plot, hlines, first_colour=len(series))
    body += _series_paths(plot, series, cleaned)
    if mark is not None:
        body.append(_mark(plot, mark, mark_label))
    body.append(_text(plot.left + plot.width / 2, height - 8, x_label, cls="axis-label x-label", anchor="middle"))
    mid = top + plot.height / 2
    rotate = f' transform="rotate(-90 14 {_num(mid)})"'
    body.append(_text(14, mid, y_label, cls="axis-label y-label", anchor="middle", extra=rotate))
    return _document(title, width, height, body)


def _box(plot: _LinePlot) -> tuple[float, float, float, float]:
    return (plot.left, plot.top, plot.right, plot.bottom)


def _line_plot(
    xs: list[float], ys: list[float], *, y_min: float | None, top: float, width: int, height: int
) -> _LinePlot:
    """The ranges (widened to whole ticks on y), the ticks, and the plot area left of the y labels."""
    x_lo, x_hi = _expand(min(xs), max(xs))
    y_lo = min(ys) if y_min is None else min(float(y_min), *ys)
    y_lo, y_hi = _expand(y_lo, max(ys), upward_only=y_min is not None)
    x_ticks = nice_ticks(x_lo, x_hi, outward=False)
    y_ticks = nice_ticks(y_lo, y_hi, outward=True)
    if y_min is None:
        y_lo = y_ticks[0].at
    else:
        y_ticks = [t for t in y_ticks if t.at >= y_lo - 1e-9 * max(1.0, abs(y_lo))]
    y_hi = y_ticks[-1].at
    left = 30 + max(len(t.label) for t in y_ticks) * CHAR_WIDTH + 8
    plot_w, plot_h = width - left - 20, height - top - 46
    return _LinePlot(
        left=left,
        top=top,
        width=plot_w,
        height=plot_h,
        px=Scale(x_lo, x_hi, left, plot_w),
        py=Scale(y_hi, y_lo, top, plot_h),  # upward: y_hi at the top
        x_ticks=x_ticks,
        y_ticks=y_ticks,
    )


def _y_axis(plot: _LinePlot) -> list[str]:
    parts = []
    for tick in plot.y_ticks:
        y = _num(plot.py(tick.at))
        grid = f'<line x1="{_num(plot.left)}" x2="{_num(plot.right)}" y1="{y}" y2="{y}" stroke="#ddd"/>'
        label = _text(plot.left - 6, plot.py(tick.at) + 4, tick.label, cls="tick-label", anchor="end")
        parts.append(f'<g class="y-tick">{grid}{label}</g>')
    return parts


def _hlines(plot: _LinePlot, hlines: Sequence[HLine], *, first_colour: int) -> list[str]:
    """Horizontal reference lines, coloured after the series (hlines that cannot be drawn keep their colour)."""
    parts = []
    for i, h in enumerate(hlines):
        if _usable(float(h.y)):
            colour, y = PALETTE[(first_colour + i) % len(PALETTE)], _num(plot.py(float(h.y)))
            dash = f' stroke-dasharray="{DASH}"' if h.dashed else ""
            parts.append(
                f'<line class="hline hline-{i}" x1="{_num(plot.left)}" x2="{_num(plot.right)}" y1="{y}" y2="{y}" '
                f'stroke="{colour}" stroke-width="1.5"{dash}><title>{_esc(f"{h.name}: {h.y:g}")}</title></line>'
            )
    return parts


def _series_paths(plot: _LinePlot, series: Sequence[Series], cleaned: list[list[tuple[float, float]]]) -> list[str]:
    parts = []
    for i, (s, points) in enumerate(zip(series, cleaned, strict=True)):
        if not points:
            continue
        colour = PALETTE[i % len(PALETTE)]
        dash = f' stroke-dasharray="{DASH}"' if s.dashed else ""
        scaled = [(plot.px(x), plot.py(y)) for x, y in points]
        parts.append(
            f'<path class="series series-{i}" d="{_path(scaled, step=s.step)}" fill="none" stroke="{colour}" '
            f'stroke-width="1.5" stroke-linejoin="round"{dash}><title>{_esc(s.name)}</title></path>'
        )
        if len(points) == 1:
            parts.append(
                f'<circle class="series-point series-{i}" cx="{_num(scaled[0][0])}" cy="{_num(scaled[0][1])}" '
                f'r="3" fill="{colour}"/>'
            )
    return parts


def _mark(plot: _LinePlot, mark: tuple[float, float], mark_label: str) -> str:
    """The one marked point, its label on the side with room."""
    cx, cy = plot.px(float(mark[0])), plot.py(float(mark[1]))
    right_half = cx > plot.left + plot.width / 2
    label_y = cy - 9 if cy - 9 > plot.top + 10 else cy + 18
    tooltip = _esc(mark_label or f"({mark[0]:g}, {mark[1]:g})")
    text = _text(
        cx - 9 if right_half else cx + 9,
        label_y,
        mark_label,
        cls="mark-label",
        anchor="end" if right_half else "start",
        extra=' font-weight="bold" stroke="#fff" stroke-width="3" paint-order="stroke"',
    )
    return (
        f'<g class="mark"><circle cx="{_num(cx)}" cy="{_num(cy)}" r="6" fill="{MARK_COLOUR}" stroke="#222" '
        f'stroke-width="1.5"><title>{tooltip}</title></circle>{text}</g>'
    )


def _state_class(state: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", state.lower()) or "unknown"


def gantt_chart(
    *,
    title: str,
    rows: Sequence[str],
    bars: Sequence[Bar],
    start: float,
    end: float,
    x_label: str,
    width: int = 860,
    row_height: int = 14,
    max_rows: int = 60,
) -> str:
    """One lane per row with bars coloured by state, clipped to [start, end]; rows past max_rows are dropped.

    Rows named only by a bar are appended after `rows`, in the order the bars name them.
    """
    width, row_height, max_rows = max(int(width), 240), max(int(row_height), 6), max(int(max_rows), 0)
    order = list(dict.fromkeys([*rows, *(bar.row for bar in bars)]))
    shown, hidden = order[:max_rows], max(0, len(order) - max_rows)
    note = f"{hidden} more {'row' if hidden == 1 else 'rows'} not shown" if hidden else ""
    start, end = float(start), float(end)
    if not (_usable(start) and _usable(end)):
        start, end = 0.0, 1.0
    start, end = _expand(min(start, end), max(start, end))
    index = {row: i for i, row in enumerate(shown)}
    drawn = _clipped_bars(bars, index, start, end)
    legend, legend_height = _legend(_state_legend(drawn), y0=38, width=width)
    top = 38 + legend_height + 4
    if not shown:
        return _no_data(title, width, top + 100 + (16 if note else 0), legend, top, note)

    labels = [row if len(row) <= 28 else row[:27] + "\u2026" for row in shown]
    left = 16 + max(len(label) for label in labels) * CHAR_WIDTH + 8
    plot_w, plot_h = width - left - 20, len(shown) * row_height
    bottom = top + plot_h
    height = bottom + 40 + (16 if note else 0)
    px = Scale(start, end, left, plot_w)
    body = [
        legend,
        '<g class="rows">',
        *_gantt_rows(shown, labels, left=left, top=top, width=plot_w, row_height=row_height),
    ]
    box = (left, top, left + plot_w, bottom)
    body += ['</g><g class="axes">', *_x_axis(nice_ticks(start, end, outward=False), px, box)]
    body.append('</g><g class="bars">')
    body += _gantt_bars(drawn, px, index, top=top, row_height=row_height)
    body.append("</g>")
    if not drawn:
        body.append(_text(left + plot_w / 2, top + plot_h / 2 + 4, "no data", cls="no-data", anchor="middle"))
    body.append(_text(left + plot_w / 2, bottom + 32, x_label, cls="axis-label x-label", anchor="middle"))
    if note:
        body.append(_text(left, height - 6, note, cls="note", extra=' fill="#666"'))
    return _document(title, width, height, body)


def _clipped_bars(
    bars: Sequence[Bar], index: dict[str, int], start: float, end: float
) -> list[tuple[Bar, float, float]]:
    """The bars of shown rows that overlap [start, end], with their ends clipped to it."""
    drawn: list[tuple[Bar, float, float]] = []
    for bar in bars:
        lo, hi = sorted((float(bar.start), float(bar.end)))
        overlaps = (lo < end and hi > start) or (lo == hi and start <= lo <= end)  # NaN compares false: dropped
        if bar.row in index and overlaps:
            drawn.append((bar, max(lo, start), min(hi, end)))
    return drawn


def _state_legend(drawn: list[tuple[Bar, float, float]]) -> list[tuple[str, str, bool, str]]:
    """The states drawn, known ones first in STATE_COLOURS order, then the others by name."""
    states = list(dict.fromkeys(bar.state for bar, _, _ in drawn))
    states.sort(key=lambda s: (list(STATE_COLOURS).index(s) if s in STATE_COLOURS else len(STATE_COLOURS), s))
    return [(state, STATE_COLOURS.get(state, OTHER_STATE_COLOUR), False, "box") for state in states]


def _gantt_rows(
    shown: list[str], labels: list[str], *, left: float, top: float, width: float, row_height: int
) -> list[str]:
    """Every other row shaded, and each row's label (the full name as tooltip when shortened)."""
    parts = []
    for i, (row, label) in enumerate(zip(shown, labels, strict=True)):
        y = top + i * row_height
        if i % 2:
            parts.append(
                f'<rect x="{_num(left)}" y="{_num(y)}" width="{_num(width)}" height="{row_height}" fill="#f4f4f4"/>'
            )
        tooltip = f"<title>{_esc(row)}</title>" if label != row else ""
        parts.append(
            f'<text class="row-label" x="{_num(left - 6)}" y="{_num(y + row_height / 2 + 4)}" '
            f'text-anchor="end">{tooltip}{_esc(label)}</text>'
        )
    return parts


def _gantt_bars(
    drawn: list[tuple[Bar, float, float]], px: Scale, index: dict[str, int], *, top: float, row_height: int
) -> list[str]:
    bar_h = max(2, row_height - 4)
    return [
        bar_rect(
            css=f"bar bar-{_state_class(bar.state)}",
            x1=px(lo),
            x2=px(hi),
            y=top + index[bar.row] * row_height + (row_height - bar_h) / 2,
            height=bar_h,
            title=bar.label or f"{bar.row} {bar.state} {bar.start:g}\u2013{bar.end:g}",
            min_width=1.0,
            attrs=f' fill="{STATE_COLOURS.get(bar.state, OTHER_STATE_COLOUR)}"',
        )
        for bar, lo, hi in drawn
    ]

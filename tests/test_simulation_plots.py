"""The dependency-free SVG charts of the simulation report: well-formed, escaped, legible and deterministic."""

from __future__ import annotations

import itertools
import math
import re
import xml.etree.ElementTree as ET

import pytest

from simulation.plots import Bar, HLine, Series, gantt_chart, line_chart

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def with_class(root: ET.Element, name: str) -> list[ET.Element]:
    return [element for element in root.iter() if name in (element.get("class") or "").split()]


def texts(element: ET.Element) -> list[str]:
    return ["".join(child.itertext()) for child in element.iter(f"{SVG}text")]


def coordinates(path: ET.Element) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in re.findall(r"[ML](-?[\d.]+) (-?[\d.]+)", path.get("d", ""))]


def y_ticks(root: ET.Element) -> list[tuple[float, float]]:
    """(value, pixel y) of each labelled tick on the y axis."""
    ticks = []
    for tick in with_class(root, "y-tick"):
        line = tick.find(f"{SVG}line")
        ticks.append((float(texts(tick)[0]), float(line.get("y1"))))
    return ticks


def x_ticks(root: ET.Element) -> list[tuple[float, float]]:
    """(value, pixel x) of each labelled tick on the x axis."""
    ticks = []
    for tick in with_class(root, "x-tick"):
        line = tick.find(f"{SVG}line")
        ticks.append((float(texts(tick)[0]), float(line.get("x1"))))
    return ticks


def value_at(ticks: list[tuple[float, float]], pixel: float) -> float:
    """The data value drawn at a pixel, from the axis' own tick positions."""
    (v0, p0), (v1, p1) = ticks[0], ticks[-1]
    return v0 + (pixel - p0) * (v1 - v0) / (p1 - p0)


def simple_chart(**overrides) -> str:
    arguments = {
        "title": "Queue length",
        "series": [Series(name="waiting", points=[(0, 1), (1, 3), (2, 2)])],
        "x_label": "hours",
        "y_label": "operations",
    }
    return line_chart(**(arguments | overrides))


def test_a_line_chart_is_a_complete_svg_document_labelled_for_screen_readers() -> None:
    svg = simple_chart()
    root = parse(svg)
    assert svg.startswith('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 860 320"')
    assert root.get("role") == "img"
    assert root.get("aria-label") == "Queue length"
    assert root.find(f"{SVG}title").text == "Queue length"
    assert {"hours", "operations"} <= set(texts(root))


def test_a_title_with_markup_characters_is_escaped_everywhere() -> None:
    title = 'a < b & "c"'
    svg = simple_chart(
        title=title,
        series=[Series(name="<script>", points=[(0, 1), (1, 2)])],
        x_label="x & y",
        y_label='"quoted"',
        mark=(1, 2),
        mark_label="<b>",
    )
    root = parse(svg)
    assert root.get("aria-label") == title
    assert root.find(f"{SVG}title").text == title
    assert title in texts(root)
    assert {"<script>", "x & y", '"quoted"', "<b>"} <= set(texts(root))
    assert "<script>" not in svg
    assert "a &lt; b &amp; &quot;c&quot;" in svg


def test_characters_xml_cannot_hold_do_not_break_the_document() -> None:
    svg = simple_chart(title="bell\x07 and \ud800 and café ✓")
    root = parse(svg)
    assert "café ✓" in root.get("aria-label")
    svg.encode("utf-8")


def test_the_legend_names_every_series_and_reference_line() -> None:
    root = parse(
        simple_chart(
            series=[
                Series(name="waiting", points=[(0, 1), (1, 3)]),
                Series(name="running", points=[(0, 2), (1, 1)], dashed=True),
            ],
            hlines=[HLine(name="capacity", y=4), HLine(name="floor", y=0, dashed=False)],
        )
    )
    (legend,) = with_class(root, "legend")
    assert texts(legend) == ["waiting", "running", "capacity", "floor"]
    assert len(with_class(root, "hline")) == 2


def test_each_series_has_its_own_class_and_colour() -> None:
    series = [Series(name=f"s{i}", points=[(0, i), (1, i + 1)]) for i in range(5)]
    root = parse(simple_chart(series=series))
    paths = [with_class(root, f"series-{i}")[0] for i in range(5)]
    assert all(path.tag == f"{SVG}path" for path in paths)
    assert len({path.get("stroke") for path in paths}) == 5


def test_a_dashed_series_is_drawn_dashed() -> None:
    root = parse(simple_chart(series=[Series(name="a", points=[(0, 1), (1, 2)], dashed=True)]))
    assert with_class(root, "series-0")[0].get("stroke-dasharray")


def test_a_short_series_is_drawn_point_for_point() -> None:
    points = [(float(i), float(i * i)) for i in range(10)]
    root = parse(simple_chart(series=[Series(name="square", points=points)]))
    assert len(coordinates(with_class(root, "series-0")[0])) == 10


def test_a_step_series_holds_its_value_until_the_next_point() -> None:
    root = parse(simple_chart(series=[Series(name="level", points=[(0, 0), (1, 1), (2, 0)], step=True)]))
    drawn = coordinates(with_class(root, "series-0")[0])
    assert len(drawn) == 5
    (_, y0), (x1, y1), (x2, y2), (x3, y3), (x4, _) = drawn
    assert y1 == y0
    assert x1 == x2
    assert y3 == y2
    assert x3 == x4
    assert y2 < y0  # the value rose to 1 at x=1 (SVG y grows downwards)


def test_a_decimated_series_keeps_its_peak_and_its_dip() -> None:
    points = [(float(i), math.sin(i / 50) * 10) for i in range(10_000)]
    points[4321] = (4321.0, 1000.0)
    points[8765] = (8765.0, -1000.0)
    root = parse(simple_chart(series=[Series(name="noisy", points=points)]))
    drawn = coordinates(with_class(root, "series-0")[0])
    assert len(drawn) <= 1500
    pixels = [y for _, y in drawn]
    ticks = y_ticks(root)
    tolerance = (ticks[-1][0] - ticks[0][0]) / 500
    assert value_at(ticks, min(pixels)) == pytest.approx(1000, abs=tolerance)
    assert value_at(ticks, max(pixels)) == pytest.approx(-1000, abs=tolerance)
    assert drawn[0][0] == min(x for x, _ in drawn)
    assert drawn[-1][0] == max(x for x, _ in drawn)


@pytest.mark.parametrize(
    ("low", "high"),
    [(0, 1), (0, 9), (0, 16), (1, 17), (-5, 5), (0.001, 0.0013), (3, 3000), (0, 1e9), (-7.3, -2.1)],
)
def test_the_axes_have_four_to_eight_nice_ticks(low, high) -> None:
    root = parse(simple_chart(series=[Series(name="s", points=[(low, low), (high, high)])]))
    for ticks in (y_ticks(root), x_ticks(root)):
        values = [value for value, _ in ticks]
        assert 4 <= len(values) <= 8
        step = values[1] - values[0]
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert min(abs(mantissa - nice) for nice in (1, 2, 5, 10)) < 1e-6
        assert all(b - a == pytest.approx(step) for a, b in itertools.pairwise(values))
    y_values = [value for value, _ in y_ticks(root)]
    assert y_values[0] <= low
    assert y_values[-1] >= high


def test_y_min_starts_the_axis_there() -> None:
    root = parse(simple_chart(series=[Series(name="s", points=[(0, 40), (1, 55)])], y_min=0))
    assert y_ticks(root)[0][0] == 0


def test_the_recommended_point_is_marked_with_its_label() -> None:
    root = parse(
        simple_chart(
            series=[Series(name="cost", points=[(1, 9), (2, 4), (4, 3), (8, 6)])],
            mark=(4, 3),
            mark_label="recommended",
        )
    )
    (mark,) = with_class(root, "mark")
    circle = mark.find(f"{SVG}circle")
    assert "recommended" in texts(mark)
    assert circle.find(f"{SVG}title").text == "recommended"
    path = coordinates(with_class(root, "series-0")[0])
    assert (float(circle.get("cx")), float(circle.get("cy"))) == path[2]


@pytest.mark.parametrize("series", [[], [Series(name="empty", points=[])]])
def test_a_chart_without_data_says_so(series) -> None:
    root = parse(simple_chart(series=series, hlines=[HLine(name="limit", y=3)], mark=(1, 1)))
    assert "no data" in texts(root)
    assert not with_class(root, "series")
    assert not with_class(root, "mark")


def test_an_empty_series_beside_real_ones_is_named_as_empty() -> None:
    root = parse(simple_chart(series=[Series(name="full", points=[(0, 1), (1, 2)]), Series(name="idle", points=[])]))
    assert "idle (no data)" in texts(root)
    assert with_class(root, "series-0")
    assert not with_class(root, "series-1")


@pytest.mark.parametrize("points", [[(0, 5), (1, 5), (2, 5)], [(3, 5)], [(2, 0), (2, 0)]])
def test_a_constant_series_is_drawn_without_dividing_by_zero(points) -> None:
    svg = simple_chart(series=[Series(name="flat", points=points)])
    root = parse(svg)
    assert "nan" not in svg.lower()
    assert "inf" not in svg.lower()
    drawn = coordinates(with_class(root, "series-0")[0])
    assert len({y for _, y in drawn}) == 1
    assert 4 <= len(y_ticks(root)) <= 8


def test_values_that_are_not_finite_are_left_out() -> None:
    points = [(0, 1), (1, math.nan), (2, math.inf), (3, 2)]
    svg = simple_chart(series=[Series(name="gappy", points=points)], hlines=[HLine(name="bad", y=math.nan)])
    assert "nan" not in svg.lower()
    assert "inf" not in svg.lower()
    assert len(coordinates(with_class(parse(svg), "series-0")[0])) == 2


def gantt(**overrides) -> str:
    arguments = {
        "title": "Visits",
        "rows": ["d1", "d2", "d3"],
        "bars": [
            Bar(row="d1", start=0, end=2, label="bios on d1"),
            Bar(row="d2", start=1, end=4, state="failed", label="bios on d2"),
            Bar(row="d3", start=3, end=5, state="running"),
        ],
        "start": 0,
        "end": 10,
        "x_label": "hours",
    }
    return gantt_chart(**(arguments | overrides))


def test_the_gantt_draws_each_bar_with_its_label_as_tooltip() -> None:
    root = parse(gantt())
    bars = with_class(root, "bar")
    assert len(bars) == 3
    assert [bar.find(f"{SVG}title").text for bar in bars[:2]] == ["bios on d1", "bios on d2"]
    assert bars[2].find(f"{SVG}title").text  # an unlabelled bar still gets a tooltip
    assert root.get("role") == "img"
    assert root.get("aria-label") == "Visits"
    assert [label.text for label in with_class(root, "row-label")] == ["d1", "d2", "d3"]


def test_bar_states_pick_their_colours_and_appear_in_the_legend() -> None:
    root = parse(gantt())
    done, failed, running = (with_class(root, f"bar-{state}")[0] for state in ("done", "failed", "running"))
    assert len({done.get("fill"), failed.get("fill"), running.get("fill")}) == 3
    assert texts(with_class(root, "legend")[0]) == ["done", "failed", "running"]


def test_bars_are_clipped_to_the_time_window() -> None:
    bars = [Bar(row="d1", start=-10, end=4), Bar(row="d2", start=6, end=25), Bar(row="d3", start=11, end=12)]
    root = parse(gantt(bars=bars))
    pixel = dict(x_ticks(root))
    first, second = with_class(root, "bar")
    assert float(first.get("x")) == pixel[0]
    assert float(first.get("x")) + float(first.get("width")) == pytest.approx(pixel[4], abs=0.02)
    assert float(second.get("x")) + float(second.get("width")) == pytest.approx(pixel[10], abs=0.02)


def test_rows_beyond_the_limit_are_dropped_with_a_note() -> None:
    rows = [f"domain-{i}" for i in range(70)]
    bars = [Bar(row=row, start=1, end=2) for row in rows]
    root = parse(gantt(rows=rows, bars=bars, max_rows=60))
    assert len(with_class(root, "row-label")) == 60
    assert len(with_class(root, "bar")) == 60
    assert "10 more rows not shown" in texts(root)
    assert "domain-60" not in texts(root)


def test_a_gantt_without_rows_says_no_data() -> None:
    root = parse(gantt(rows=[], bars=[]))
    assert "no data" in texts(root)
    assert not with_class(root, "bar")


def test_the_same_input_gives_byte_identical_output() -> None:
    points = [(float(i), float((i * 7919) % 101)) for i in range(5000)]

    def draw() -> tuple[str, str]:
        chart = line_chart(
            title="Cost by domain size",
            series=[Series(name="cost", points=points), Series(name="steps", points=points[:50], step=True)],
            x_label="domain size",
            y_label="hours",
            hlines=[HLine(name="budget", y=60)],
            mark=(10, 40),
            mark_label="recommended",
        )
        return chart, gantt()

    assert draw() == draw()

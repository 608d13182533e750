"""The report's pieces on their own: legends, spans, numbers, escaping inside SVG."""

from __future__ import annotations

from trainprof.report import format as fmt
from trainprof.report import svg
from trainprof.report.build import _spans, legend_text


def test_a_legend_fills_in_labels_and_leaves_braces_inside_values_alone():
    labels = {"node": "n{{gpu}}1", "gpu": "0"}
    assert legend_text("{{node}} GPU {{ gpu }}", labels) == "n{{gpu}}1 GPU 0"
    assert legend_text("", {"__name__": "x", "b": "2", "a": "1"}) == "a=1, b=2"


def test_firing_points_become_spans_that_break_at_gaps():
    points = [(10, 1), (20, 1), (30, 0), (40, 2), (50, 1), (90, 1)]
    assert _spans(points, 10) == [(0, 20), (30, 50), (80, 90)]


def test_numbers_read_as_people_write_them():
    assert [fmt.duration(s) for s in (0.0004, 0.25, 42, 696, 7500, 200000)] == [
        "400 µs",
        "250 ms",
        "42 s",
        "11 min 36 s",
        "2 h 05 min",
        "2 d 7 h",
    ]
    assert fmt.value(0.999, "percentunit") == "99.9%"
    assert fmt.value(1.0, "percentunit") == "100%"
    assert fmt.value(None, "s") == "-"


def test_chart_text_is_escaped_inside_the_svg():
    drawn = svg.line_chart(
        [("<b>", [(0, 0.5), (60, 0.7)])],
        unit="percentunit",
        start=0,
        end=60,
        threshold=0.6,
        threshold_text='a "<script>" & b',
        label="<i>",
    )
    assert "<script>" not in drawn and "<i>" not in drawn
    assert "&lt;script&gt;" in drawn and 'aria-label="&lt;i&gt;"' in drawn


def test_a_gap_in_the_samples_is_drawn_as_a_gap():
    drawn = svg.line_chart(
        [("s", [(0, 0.1), (10, 0.2), (20, 0.3), (200, 0.4), (210, 0.5)])],
        unit="percentunit",
        start=0,
        end=210,
    )
    assert drawn.count("<polyline") == 2

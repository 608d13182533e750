"""Plots as inline SVG, drawn here so the report needs no script and no network.

Every piece of text that reaches the markup goes through `esc`: series names come from label
values, which a job may set to anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from trainprof.report import format as fmt

PALETTE = (
    "#3566a8",
    "#e07b28",
    "#3b9a57",
    "#c23b3b",
    "#7d5ba6",
    "#8c5a45",
    "#d463a8",
    "#6f7a85",
    "#a9a83a",
    "#2aa6b8",
    "#1f3f6b",
    "#b5651d",
)
FIRING_FILL = "#c23b3b"
WIDTH, HEIGHT = 760, 210  # a chart across the page
CHART_WIDTH = 540  # a chart in a column of two
LEFT, RIGHT, TOP, BOTTOM = 58, 14, 10, 26


def esc(text: object) -> str:
    return escape(fmt.visible(str(text)), quote=True)


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def opening(width: int, height: int, label: str, css: str = "chart") -> list[str]:
    """The `<svg>` start tag of a chart, its label for screen readers, as the first piece."""
    return [
        f'<svg class="{css}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{esc(label)}" xmlns="http://www.w3.org/2000/svg">'
    ]


def y_axis(out: list[str], top: float, unit: str, plot_h: float, width: int) -> None:
    """Horizontal grid lines at round steps from 0 to `top`, each labelled in `unit`."""
    for tick in _frange(0, top, nice_step(top)):
        ty = TOP + plot_h - tick / top * plot_h
        out.append(
            f'<line x1="{LEFT}" x2="{width - RIGHT}" y1="{ty:.1f}" y2="{ty:.1f}" class="grid"/>'
        )
        out.append(
            f'<text x="{LEFT - 6}" y="{ty + 3.5:.1f}" class="tick" '
            f'text-anchor="end">{esc(fmt.axis(tick, unit))}</text>'
        )


def category(i: int, slot: float, plot_h: float, name: str) -> str:
    """The name under the `i`-th slot of a bar chart."""
    return (
        f'<text x="{LEFT + (i + 0.5) * slot:.1f}" y="{TOP + plot_h + 14}" '
        f'class="tick" text-anchor="middle">{esc(name)}</text>'
    )


def bar(x: float, h: float, width: float, plot_h: float, fill: str, title: str) -> str:
    """A bar `h` high standing on the plot's floor, `title` (markup) as its tooltip."""
    return (
        f'<rect x="{x:.1f}" y="{TOP + plot_h - h:.1f}" width="{width:.1f}" '
        f'height="{h:.1f}" fill="{fill}"><title>{title}</title></rect>'
    )


def framed(out: list[str], plot_w: float, plot_h: float) -> str:
    """The chart's markup, closed with the frame around its plot area."""
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" class="frame"/>')
    out.append("</svg>")
    return "".join(out)


def nice_step(span: float, ticks: int = 4) -> float:
    """A round step (1, 2, 2.5 or 5 times a power of ten) that cuts `span` into about `ticks`.

    >>> nice_step(7.3), nice_step(0.9), nice_step(3600, 6)
    (2, 0.25, 1000)
    """
    raw = span / max(ticks, 1)
    power = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * power:
            return m * power
    return 10 * power


_TIME_STEPS = (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def _time_ticks(start: float, end: float) -> list[float]:
    span = max(end - start, 1)
    step = next((s for s in _TIME_STEPS if span / s <= 7), 86400 * math.ceil(span / 86400 / 7))
    first = math.ceil(start / step) * step
    return [t for t in _frange(first, end, step)]


def _frange(a: float, b: float, step: float):
    x = a
    while x <= b + 1e-9:
        yield x
        x += step


def _y_max(values: Sequence[float], unit: str, threshold: float | None) -> float:
    top = max([v for v in values if v == v] + ([threshold * 1.15] if threshold else []) + [0])
    if unit == "percentunit":
        return max(1.0, top)
    if top <= 0:
        return 1.0
    step = nice_step(top)
    return step * math.ceil(top / step)


def line_chart(
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    *,
    unit: str,
    start: float,
    end: float,
    threshold: float | None = None,
    fires: str = "above",
    threshold_text: str = "",
    firing: Sequence[tuple[float, float]] = (),
    label: str = "",
) -> str:
    """Lines over time; a threshold as a dashed line with the firing side tinted, and the
    spans in which the rule fired shaded."""
    end = max(end, start + 1)
    width = CHART_WIDTH
    plot_w, plot_h = width - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    values = [v for _, points in series for _, v in points]
    top = _y_max(values, unit, threshold)

    def x(t: float) -> float:
        return LEFT + (min(max(t, start), end) - start) / (end - start) * plot_w

    def y(v: float) -> float:
        return TOP + plot_h - max(min(v, top), 0) / top * plot_h

    out = opening(width, HEIGHT, label)
    for a, b in firing:
        a, b = max(a, start), min(b, end)
        if b > a:
            out.append(
                f'<rect x="{x(a):.1f}" y="{TOP}" width="{max(x(b) - x(a), 1.5):.1f}" '
                f'height="{plot_h}" fill="{FIRING_FILL}" fill-opacity="0.10"/>'
            )
    if threshold is not None:
        ty = y(threshold)
        band = (TOP, ty - TOP) if fires == "above" else (ty, TOP + plot_h - ty)
        out.append(
            f'<rect x="{LEFT}" y="{band[0]:.1f}" width="{plot_w}" '
            f'height="{max(band[1], 0):.1f}" fill="{FIRING_FILL}" fill-opacity="0.05"/>'
        )
    y_axis(out, top, unit, plot_h, width)
    for t in _time_ticks(start, end):
        tx = x(t)
        out.append(
            f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{TOP}" y2="{TOP + plot_h}" class="grid"/>'
        )
        out.append(
            f'<text x="{tx:.1f}" y="{HEIGHT - 8}" class="tick" '
            f'text-anchor="middle">{esc(fmt.tick_time(t, end - start))}</text>'
        )
    for i, (_, points) in enumerate(series):
        for segment in _segments(points):
            if len(segment) == 1:
                t, v = segment[0]
                out.append(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="1.8" fill="{color(i)}"/>')
                continue
            path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in segment)
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{color(i)}" '
                'stroke-width="1.6" stroke-linejoin="round"/>'
            )
    if threshold is not None:
        ty = y(threshold)
        out.append(
            f'<line x1="{LEFT}" x2="{width - RIGHT}" y1="{ty:.1f}" y2="{ty:.1f}" '
            f'stroke="{FIRING_FILL}" stroke-width="1.2" stroke-dasharray="6 4"/>'
        )
        out.append(
            f'<text x="{width - RIGHT - 4}" y="{ty - 4:.1f}" class="threshold" '
            f'text-anchor="end">{esc(threshold_text)}</text>'
        )
    return framed(out, plot_w, plot_h)


def _segments(points: Sequence[tuple[float, float]]) -> list[list[tuple[float, float]]]:
    """Split where samples are missing, so a gap is drawn as a gap."""
    points = sorted(p for p in points if p[1] == p[1] and not math.isinf(p[1]))
    if len(points) < 2:
        return [points] if points else []
    gaps = sorted(b[0] - a[0] for a, b in zip(points, points[1:]))
    limit = 2.5 * gaps[len(gaps) // 2]
    segments, current = [], [points[0]]
    for a, b in zip(points, points[1:]):
        if b[0] - a[0] > limit:
            segments.append(current)
            current = []
        current.append(b)
    segments.append(current)
    return segments


def bar_chart(
    bars: Sequence[tuple[str, float]], *, unit: str, label: str = "", value_unit: str | None = None
) -> str:
    """Vertical bars with their labels below (a histogram's buckets, say)."""
    height = 200
    plot_h = height - TOP - 44
    width = CHART_WIDTH
    plot_w = width - LEFT - RIGHT
    top = _y_max([v for _, v in bars], unit, None)
    slot = plot_w / max(len(bars), 1)
    out = opening(width, height, label)
    y_axis(out, top, unit, plot_h, width)
    for i, (name, v) in enumerate(bars):
        h = v / top * plot_h if top else 0
        bx = LEFT + i * slot + slot * 0.12
        title = f"{esc(name)}: {esc(fmt.value(v, value_unit or unit))}"
        out.append(bar(bx, h, slot * 0.76, plot_h, PALETTE[0], title))
        out.append(category(i, slot, plot_h, name))
    return framed(out, plot_w, plot_h)


def share_bar(parts: Sequence[tuple[str, float]], label: str = "") -> str:
    """One horizontal bar split into shares (a phase breakdown)."""
    height, bar_h = 34, 22
    total = sum(v for _, v in parts) or 1
    out = opening(WIDTH, height, label, "chart share")
    x0 = 0.0
    for i, (name, v) in enumerate(parts):
        w = v / total * WIDTH
        out.append(
            f'<rect x="{x0:.1f}" y="4" width="{w:.1f}" height="{bar_h}" '
            f'fill="{color(i)}"><title>{esc(name)}: {v / total:.1%}</title></rect>'
        )
        if w > 70:
            out.append(
                f'<text x="{x0 + 6:.1f}" y="19" class="inbar">{esc(name)} {v / total:.0%}</text>'
            )
        x0 += w
    out.append("</svg>")
    return "".join(out)


def timeline(
    rows: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    *,
    start: float,
    end: float,
    label: str = "",
) -> str:
    """One lane per rule, red where it fired."""
    lane = 20
    left = 170
    height = TOP + lane * len(rows) + BOTTOM
    end = max(end, start + 1)
    plot_w = WIDTH - left - RIGHT

    def x(t: float) -> float:
        return left + (min(max(t, start), end) - start) / (end - start) * plot_w

    out = opening(WIDTH, height, label)
    for t in _time_ticks(start, end):
        out.append(
            f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{TOP}" '
            f'y2="{height - BOTTOM}" class="grid"/>'
        )
        out.append(
            f'<text x="{x(t):.1f}" y="{height - 8}" class="tick" text-anchor="middle">'
            f"{esc(fmt.tick_time(t, end - start))}</text>"
        )
    for i, (name, spans) in enumerate(rows):
        ly = TOP + i * lane
        out.append(
            f'<text x="{left - 8}" y="{ly + 14}" class="lane" text-anchor="end">{esc(name)}</text>'
        )
        out.append(
            f'<rect x="{left}" y="{ly + 4}" width="{plot_w}" height="{lane - 8}" class="lane-bg"/>'
        )
        for a, b in spans:
            out.append(
                f'<rect x="{x(a):.1f}" y="{ly + 3}" width="{max(x(b) - x(a), 2):.1f}" '
                f'height="{lane - 6}" fill="{FIRING_FILL}"><title>{esc(name)} fired '
                f"{esc(fmt.when(a))} to {esc(fmt.when(b))}</title></rect>"
            )
    out.append("</svg>")
    return "".join(out)

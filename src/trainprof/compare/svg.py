"""The compare report's plots as inline SVG, in the profiling report's style
(`report.svg`): two runs overlaid, one colour each, on axes both share.

Runs start at different times, so lines are drawn against the time since each run's start;
distributions are shares of the run's steps or samples, so runs of different lengths
overlay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from trainprof.report import format as fmt
from trainprof.report.svg import (
    BOTTOM,
    CHART_WIDTH,
    HEIGHT,
    LEFT,
    RIGHT,
    TOP,
    bar,
    category,
    color,
    esc,
    framed,
    nice_step,
    opening,
    y_axis,
)

# Run A and run B: the report's first two colours.
RUN_COLORS = (color(0), color(1))


def grouped_bars(
    categories: Sequence[str],
    runs: Sequence[tuple[str, Sequence[float]]],
    *,
    unit: str = "percentunit",
    label: str = "",
) -> str:
    """One group of bars per category, one bar per run (shares of its steps, say)."""
    height = 200
    plot_h = height - TOP - 44
    width = CHART_WIDTH
    plot_w = width - LEFT - RIGHT
    values = [v for _, vs in runs for v in vs if math.isfinite(v)]
    top = max(values + [0.0]) or 1.0
    if unit == "percentunit":
        top = min(1.0, nice_step(top) * math.ceil(top / nice_step(top)))
    out = opening(width, height, label)
    y_axis(out, top, unit, plot_h, width)
    slot = plot_w / max(len(categories), 1)
    bar_w = slot * 0.76 / max(len(runs), 1)
    for i, name in enumerate(categories):
        for j, (run, vs) in enumerate(runs):
            v = vs[i] if i < len(vs) and math.isfinite(vs[i]) else 0.0
            h = v / top * plot_h
            bx = LEFT + i * slot + slot * 0.12 + j * bar_w
            title = f"{esc(run)} {esc(name)}: {esc(fmt.value(v, unit))}"
            out.append(bar(bx, h, bar_w, plot_h, RUN_COLORS[j % 2], title))
        out.append(category(i, slot, plot_h, name))
    return framed(out, plot_w, plot_h)


def overlay(
    runs: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    *,
    x_unit: str,
    y_unit: str,
    label: str = "",
    x_max: float | None = None,
    y_max: float | None = None,
    steps: bool = False,
) -> str:
    """Each run's points as a line on shared axes: x in `x_unit` (s: time since the run's
    start; percentunit: a utilisation), y in `y_unit`. `steps`: a cumulative distribution,
    drawn as a staircase."""
    width = CHART_WIDTH
    plot_w, plot_h = width - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    xs = [x for _, pts in runs for x, _ in pts if math.isfinite(x)]
    ys = [y for _, pts in runs for _, y in pts if math.isfinite(y)]
    right = x_max if x_max is not None else (max(xs) if xs else 1.0) or 1.0
    top = y_max if y_max is not None else (max(ys) if ys else 1.0) or 1.0
    if y_max is None:
        top = nice_step(top) * math.ceil(top / nice_step(top))

    def x(v: float) -> float:
        return LEFT + min(max(v, 0.0), right) / right * plot_w

    def y(v: float) -> float:
        return TOP + plot_h - max(min(v, top), 0.0) / top * plot_h

    out = opening(width, HEIGHT, label)
    y_axis(out, top, y_unit, plot_h, width)
    step = nice_step(right, 6)
    tick = 0.0
    while tick <= right + 1e-9:
        tx = x(tick)
        out.append(
            f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{TOP}" y2="{TOP + plot_h}" class="grid"/>'
        )
        out.append(
            f'<text x="{tx:.1f}" y="{HEIGHT - 8}" class="tick" '
            f'text-anchor="middle">{esc(fmt.axis(tick, x_unit))}</text>'
        )
        tick += step
    for j, (run, points) in enumerate(runs):
        pts = sorted((px, py) for px, py in points if math.isfinite(px) and math.isfinite(py))
        if not pts:
            continue
        if steps:
            drawn, previous = [], 0.0
            for px, py in pts:
                drawn += [(px, previous), (px, py)]
                previous = py
            pts = drawn
        if len(pts) == 1:
            px, py = pts[0]
            out.append(
                f'<circle cx="{x(px):.1f}" cy="{y(py):.1f}" r="2" fill="{RUN_COLORS[j % 2]}"/>'
            )
            continue
        path = " ".join(f"{x(px):.1f},{y(py):.1f}" for px, py in pts)
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{RUN_COLORS[j % 2]}" '
            f'stroke-width="1.8" stroke-linejoin="round"><title>{esc(run)}</title></polyline>'
        )
    return framed(out, plot_w, plot_h)

"""Interleaved measurement, the way every benchmark here compares variants.

Each round runs every variant once, in turn (A B C A B C ...), so a neighbour that slows the
machine for a while slows all variants of a round alike. A benchmark reports, per variant, the
median of its rounds with the min and max beside it, and each ratio as the median of the
per-round ratios (with their min and max): a ratio taken inside one round is the figure that
survives a shared machine.

    >>> stats = Spread([3.0, 1.0, 2.0])
    >>> stats.median, stats.low, stats.high
    (2.0, 1.0, 3.0)
    >>> str(stats), stats.cell("{:.1f}")
    ('2 (1-3)', '2.0 (1.0-3.0)')
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
from collections.abc import Callable, Iterable, Sequence


class Spread:
    """The median, min and max of a variant's rounds."""

    def __init__(self, values: Iterable[float]):
        self.values = sorted(values)
        if not self.values:
            raise ValueError("no rounds measured")
        self.median = statistics.median(self.values)
        self.low, self.high = self.values[0], self.values[-1]

    def cell(self, fmt: str = "{:.3g}") -> str:
        """`median (min-max)`, each formatted with `fmt`."""
        return f"{fmt.format(self.median)} ({fmt.format(self.low)}-{fmt.format(self.high)})"

    def __str__(self) -> str:
        return self.cell("{:g}")


def rounds(
    variants: Sequence[tuple[str, Callable[[], float]]], count: int
) -> dict[str, list[float]]:
    """Run each variant's measurement `count` times, interleaved; {name: [one per round]}."""
    out: dict[str, list[float]] = {name: [] for name, _ in variants}
    for _ in range(count):
        for name, measure in variants:
            out[name].append(measure())
    return out


def ratios(results: dict[str, list[float]], variant: str, peer: str) -> Spread:
    """`variant` / `peer`, round by round."""
    return Spread(a / b for a, b in zip(results[variant], results[peer]))


def load_average() -> str:
    """The 1-minute load average and the cores it is spread over, for a table's caption."""
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "load unknown"
    return f"load average {one:.1f} / {five:.1f} (1 / 5 min) on {os.cpu_count()} cores"


def machine() -> str:
    """What ran it: CPU model, cores, Python."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                model,
            )
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def caption(what: str) -> str:
    """`what`, today's date, the machine and its load: the line above a table."""
    today = datetime.date.today().isoformat()
    return f"{what} ({today}; {machine()}; {load_average()})"

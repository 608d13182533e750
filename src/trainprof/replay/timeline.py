"""A recorded timeline, scraped the way Prometheus would have scraped it.

Host samples go through the exporter's own `SampleAccumulator` (one per node), so replay
sees exactly the series a live exporter would have served; the accumulators are read at
every scrape instant `t0 + k * scrape_interval`. Times are relative to `t0` (the first
sample's minute, as SageMaker's rules started their scan there), because that is how
promtool numbers its input; timestamps *inside* series (a process start time, say) are
shifted by the same amount so `time()` in a rule still measures the right age.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Callable, Iterable, Iterator

from trainprof.promtool import series_text
from trainprof.sampling import BottleneckGrid, HostSample, SampleAccumulator, samples_of

EXPORTER_JOB = "trainprof"
EXPORTER_PORT = 9945


@dataclasses.dataclass
class Timeline:
    """What happened on each host (and, once added, in each training process)."""

    hosts: dict[str, list[HostSample]]
    training_job: str
    datapoint_interval: float
    # Producers of extra series (training processes): given the scrape instants, yield
    # (series key, values at each instant); timestamps in values are absolute.
    extra: list[Callable[[list[float]], Iterator[tuple[str, list[float | None]]]]] = \
        dataclasses.field(default_factory=list)

    @property
    def first(self) -> float:
        return min(s[0].timestamp for s in self.hosts.values() if s)

    @property
    def last(self) -> float:
        return max(s[-1].timestamp for s in self.hosts.values() if s)

    @property
    def start(self) -> float:
        """t0: the minute the first sample fell in."""
        return math.floor(self.first / 60) * 60


@dataclasses.dataclass
class Scraped:
    series: dict[str, list[float | None]]
    start: float            # t0, Unix seconds
    end: float              # seconds after t0 of the last scrape
    scrapes: int


def host_identity(node: str, training_job: str) -> dict[str, str]:
    return {"job": EXPORTER_JOB, "instance": f"{node}:{EXPORTER_PORT}", "node": node,
            "training_job": training_job}


def scrape(timeline: Timeline, scrape_interval: float, grid: BottleneckGrid | None = None,
           progress: bool = False) -> Scraped:
    if not any(timeline.hosts.values()):
        raise ValueError("the timeline holds no samples")
    t0 = timeline.start
    count = int(math.ceil((timeline.last - t0) / scrape_interval)) + 1
    instants = [t0 + k * scrape_interval for k in range(count)]
    series: dict[str, list[float | None]] = {}
    bar = _Progress(sum(len(s) for s in timeline.hosts.values()), progress)
    for node, samples in sorted(timeline.hosts.items()):
        acc = SampleAccumulator(timeline.datapoint_interval,
                                identity=host_identity(node, timeline.training_job), grid=grid)
        i = 0
        for k, instant in enumerate(instants):
            while i < len(samples) and samples[i].timestamp <= instant + 1e-9:
                acc.observe(samples[i])
                i += 1
            bar.advance(i)
            if acc.samples == 0:
                continue      # the exporter was not up yet
            for name, labels, value in samples_of(acc.families()):
                series.setdefault(series_text(name, labels), [None] * count)[k] = value
        bar.done_with(len(samples))
    for produce in timeline.extra:
        for key, values in produce(instants):
            series[key] = [None if v is None else v for v in values]
    bar.close()
    return Scraped(series, t0, instants[-1] - t0, count)


def shift_timestamps(series: dict[str, list[float | None]], t0: float,
                     names: Iterable[str]) -> None:
    """Make timestamp-valued series relative to t0, as promtool's clock starts at 0."""
    prefixes = tuple(n + "{" for n in names)
    for key, values in series.items():
        if key.startswith(prefixes):
            series[key] = [None if v is None else v - t0 for v in values]


class _Progress:
    """A one-line progress bar on stderr for long timelines (only on a terminal)."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.base, self.shown = max(total, 1), 0, -1
        self.enabled = enabled and sys.stderr.isatty() and total > 20_000

    def advance(self, done_in_node: int) -> None:
        if not self.enabled:
            return
        percent = int(100 * (self.base + done_in_node) / self.total)
        if percent != self.shown:
            self.shown = percent
            filled = percent // 4
            sys.stderr.write(f"\rreplaying [{'#' * filled}{'.' * (25 - filled)}] {percent:3d}%")
            sys.stderr.flush()

    def done_with(self, n: int) -> None:
        self.base += n

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 50 + "\r")
            sys.stderr.flush()

"""A recorded timeline, scraped the way Prometheus would have scraped it.

Host samples go through the exporter's own `SampleAccumulator` (one per node) and training
steps and phase times through the training API's own `TrainingState` (one per rank), so
replay sees exactly
the series a live exporter and training process would have served; both are read at every
scrape instant `t0 + k * scrape_interval`. Times are relative to `t0` (the first
sample's minute, as SageMaker's rules started their scan there), because that is how
promtool numbers its input; timestamps *inside* series (a process start time, say) are
shifted by the same amount so `time()` in a rule still measures the right age.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Iterable, Mapping, Sequence

from trainprof.contract import metrics as contract
from trainprof.contract.names import JOB_LABEL
from trainprof.contract.sampling import BottleneckGrid, HostSample, SampleAccumulator, samples_of
from trainprof.replay.exporters import NAMESPACE, Exporters
from trainprof.replay.series_store import SeriesStore
from trainprof.training.state import TrainingState

EXPORTER_JOB = "trainprof"
EXPORTER_PORT = 9945
TRAINING_JOB = "trainprof-training"
TRAINING_PORT = 9946
# Timelines with more samples and steps than this show progress on a terminal.
PROGRESS_FROM = 20_000
# Series whose values are Unix times: promtool's clock starts at 0, so they are shifted.
TIMESTAMP_SERIES = (
    contract.TRAINING_START_TIMESTAMP_SECONDS,
    contract.TRAINING_FIRST_STEP_TIMESTAMP_SECONDS,
    contract.TRAINING_LAST_STEP_TIMESTAMP_SECONDS,
)


@dataclasses.dataclass(frozen=True)
class Step:
    node: str
    rank: int
    mode: str  # a contract mode: train, eval, predict, global
    start: float  # Unix seconds
    end: float


@dataclasses.dataclass(frozen=True)
class PhaseTotals:
    """A rank's cumulative seconds per phase at `t` (Unix seconds), as a recording holds
    them (`recording.phases_record`)."""

    node: str
    rank: int
    t: float
    seconds: tuple[tuple[str, float], ...]  # (phase, seconds), in the recorded order


@dataclasses.dataclass
class Timeline:
    """What happened on each host and in each training process (rank)."""

    hosts: dict[str, Sequence[HostSample]]
    training_job: str
    datapoint_interval: float
    steps: list[Step] = dataclasses.field(default_factory=list)
    # Ranks that left a trace, (node, rank): they exist from the job's start even when
    # they never completed a step (MaxInitializationTime needs them).
    ranks: list[tuple[str, int]] = dataclasses.field(default_factory=list)
    # When each rank's process started, where known (a trainprof recording says so; for
    # SageMaker output the job's start stands in).
    rank_starts: dict[tuple[str, int], float] = dataclasses.field(default_factory=dict)
    # Each rank's phase totals over time (a trainprof recording; SageMaker output has none).
    phases: list[PhaseTotals] = dataclasses.field(default_factory=list)
    # Later starts of a rank's process (a recording of several runs of the job, or a rank
    # that restarted): from each, the rank serves a new process' series, counters from zero.
    rank_restarts: dict[tuple[str, int], list[float]] = dataclasses.field(default_factory=dict)
    # When a rank's process stopped serving metrics, where its recording says so (its end
    # record): its series end there, as Prometheus marks a gone target's series stale.
    rank_ends: dict[tuple[str, int], float] = dataclasses.field(default_factory=dict)

    @property
    def first(self) -> float:
        return min(
            [s[0].timestamp for s in self.hosts.values() if s]
            + [s.start for s in self.steps]
            + list(self.rank_starts.values())
            + [p.t for p in self.phases]
        )

    @property
    def last(self) -> float:
        # A rank writes its last phase totals after its last step: the last scrape sees them.
        return max(
            [s[-1].timestamp for s in self.hosts.values() if s]
            + [s.end for s in self.steps]
            + [p.t for p in self.phases]
            + list(self.rank_ends.values())
        )

    def first_rank_end(self, scrape_interval: float) -> float | None:
        """Seconds after `start` of the last scrape that saw the first rank to end, or None
        when no rank's recording says it ended."""
        if not self.rank_ends:
            return None
        first = min(self.rank_ends.values())
        return math.ceil((first - self.start) / scrape_interval - 1e-9) * scrape_interval

    def training_end(self, scrape_interval: float) -> float | None:
        """Seconds after `start` of the last scrape that saw a training process, when every
        rank's recording says when it ended; else None (they ran to the end)."""
        ranks = set(self.ranks) | {(s.node, s.rank) for s in self.steps}
        if not ranks or not ranks <= set(self.rank_ends):
            return None
        last = max(self.rank_ends[r] for r in ranks)
        return math.ceil((last - self.start) / scrape_interval - 1e-9) * scrape_interval

    @property
    def start(self) -> float:
        """t0: the minute the first sample fell in."""
        return math.floor(self.first / 60) * 60


@dataclasses.dataclass
class Scraped:
    series: SeriesStore  # (series text, values in promtool's notation) by `items()`
    start: float  # t0, Unix seconds
    end: float  # seconds after t0 of the last scrape
    scrapes: int


def host_identity(node: str, training_job: str, namespace: str = "") -> dict[str, str]:
    return {
        "job": EXPORTER_JOB,
        "instance": f"{node}:{EXPORTER_PORT}",
        "node": node,
        **({"namespace": namespace} if namespace else {}),
        JOB_LABEL: training_job,
    }


def rank_identity(node: str, rank: int, index: int, training_job: str) -> dict[str, str]:
    """Target labels of a rank's /metrics (one port per process on its node) plus the
    identity the training process itself exports."""
    return {
        "job": TRAINING_JOB,
        "instance": f"{node}:{TRAINING_PORT + index}",
        "node": node,
        JOB_LABEL: training_job,
        "rank": str(rank),
    }


def scrape(
    timeline: Timeline,
    scrape_interval: float,
    grid: BottleneckGrid | None = None,
    progress: bool = False,
    stddevs: Iterable[float] = (),
    relative: Iterable[str] = TIMESTAMP_SERIES,
    workdir: str | None = None,
    stream=None,
    exporters: Exporters | None = None,
    store: SeriesStore | None = None,
) -> Scraped:
    """Every series at every scrape instant, in time linear in the samples and steps times
    the instants. Series named in `relative` hold Unix times and are made relative to t0,
    as promtool's clock starts at 0. `exporters`: dcgm-exporter's and node_exporter's series
    too (or instead of trainprof's exporter), and the ranks' GPU assignment they join on.
    `store`: where the series go (default: a SeriesStore of the whole job)."""
    t0 = timeline.start
    count = instants(timeline, scrape_interval)
    store = SeriesStore(count, spill_dir=workdir) if store is None else store
    shifted = frozenset(relative)
    total = (
        sum(len(s) for s in timeline.hosts.values()) + len(timeline.steps) + len(timeline.phases)
    )
    bar = _Progress(total, progress, stream)
    own_exporter = exporters is None or exporters.trainprof
    namespace = NAMESPACE if exporters is not None and exporters.by_pods(timeline) else ""
    for node, samples in sorted(timeline.hosts.items()):
        if not own_exporter:
            break
        acc = SampleAccumulator(
            timeline.datapoint_interval,
            identity=host_identity(node, timeline.training_job, namespace),
            grid=grid,
        )
        times = getattr(samples, "times", None) or [s.timestamp for s in samples]
        i = 0
        writer, seen = None, None
        for k in range(count):
            instant = t0 + k * scrape_interval
            before = i
            while i < len(times) and times[i] <= instant + 1e-9:
                acc.observe(samples[i])
                i += 1
            bar.advance(i - before)
            if acc.samples == 0:
                continue  # the exporter was not up yet
            # The series of a scrape are named once per shape (SampleAccumulator.row).
            shape, values = acc.row()
            if shape != seen:
                rows = list(samples_of(acc.families()))
                writer = store.writer([store.id_of(n, labels) for n, labels, _ in rows], writer)
                seen = shape
            writer.put(k, values)  # type: ignore[union-attr]  # made for the first shape
    gpus = {}
    if exporters is not None:
        exporters.scrape(
            timeline, store, count, scrape_interval, None if own_exporter else bar.advance
        )
        gpus = exporters.assignments(timeline)
    _scrape_ranks(timeline, count, scrape_interval, t0, tuple(stddevs), store, shifted, bar, gpus)
    bar.close()
    return Scraped(store, t0, (count - 1) * scrape_interval, count)


def instants(timeline: Timeline, scrape_interval: float) -> int:
    """The scrape instants t0, t0 + scrape_interval, ... up to the timeline's last sample."""
    if not any(timeline.hosts.values()) and not timeline.steps and not timeline.ranks:
        raise ValueError("the timeline holds no samples and no steps")
    return int(math.ceil((timeline.last - timeline.start) / scrape_interval)) + 1


def _scrape_ranks(
    timeline: Timeline,
    count: int,
    scrape_interval: float,
    t0: float,
    stddevs: tuple[float, ...],
    store: SeriesStore,
    shifted: frozenset,
    bar: _Progress,
    gpus: Mapping[tuple[str, int], list[tuple[str, str]]] | None = None,
) -> None:
    """Every rank's training series: its steps, observed as they end, and its phase totals,
    observed as recorded, read at each instant; `gpus`, the (index, UUID) pairs a rank's
    training API serves as its GPU assignment."""
    by_rank: dict[tuple[str, int], list[Step]] = {r: [] for r in timeline.ranks}
    for step in timeline.steps:
        by_rank.setdefault((step.node, step.rank), []).append(step)
    phases_by_rank: dict[tuple[str, int], list[PhaseTotals]] = {}
    for totals in timeline.phases:
        phases_by_rank.setdefault((totals.node, totals.rank), []).append(totals)
        by_rank.setdefault((totals.node, totals.rank), [])
    per_node: dict[str, int] = {}
    for (node, rank), steps in sorted(by_rank.items()):
        index = per_node[node] = per_node.get(node, -1) + 1
        labels = rank_identity(node, rank, index, timeline.training_job)
        target = {k: labels.pop(k) for k in ("job", "instance")}
        state = TrainingState(
            labels, stddevs=stddevs, start_time=timeline.rank_starts.get((node, rank), t0)
        )
        if gpus and (node, rank) in gpus:
            state.set_gpus(gpus[(node, rank)])
        steps.sort(key=lambda s: s.end)
        phases = sorted(phases_by_rank.get((node, rank), []), key=lambda p: p.t)
        restarts = list(timeline.rank_restarts.get((node, rank), []))
        observed: dict[str, float] = {}
        # Scraped up to the first scrape at or after its end (it served what it did to
        # the last), then stale, as Prometheus marks a gone target's series.
        end = timeline.rank_ends.get((node, rank))
        last = count - 1
        if end is not None:
            last = min(last, math.ceil((end - t0) / scrape_interval - 1e-9))
        served: set[int] = set()
        i = j = 0
        writer, seen, moved = None, None, []
        for k in range(last + 1):
            instant = t0 + k * scrape_interval
            before = i + j
            while restarts and restarts[0] <= instant + 1e-9:
                # What the old process did before the new one started is its own; the new
                # process serves its series from zero, as a restarted target does.
                restart = restarts.pop(0)
                while i < len(steps) and steps[i].end <= restart:
                    state.observe_step(steps[i].mode, steps[i].start, steps[i].end)
                    i += 1
                while j < len(phases) and phases[j].t <= restart:
                    j += 1
                state = TrainingState(labels, stddevs=stddevs, start_time=restart)
                if gpus and (node, rank) in gpus:
                    state.set_gpus(gpus[(node, rank)])
                observed = {}
            while i < len(steps) and steps[i].end <= instant + 1e-9:
                state.observe_step(steps[i].mode, steps[i].start, steps[i].end)
                i += 1
            while j < len(phases) and phases[j].t <= instant + 1e-9:
                observed = observe_phase_totals(state, observed, phases[j].seconds)
                j += 1
            bar.advance(i + j - before)
            shape, values = state.row()
            if shape != seen:
                rows = list(samples_of(state.families()))
                ids = [store.id_of(n, {**labels, **target}) for n, labels, _ in rows]
                writer = store.writer(ids, writer)
                served.update(ids)
                seen, moved = shape, [x for x, (n, _, _) in enumerate(rows) if n in shifted]
            for x in moved:
                values[x] -= t0
            writer.put(k, values)  # type: ignore[union-attr]  # made for the first shape
        bar.advance(len(steps) - i + len(phases) - j)
        if writer is not None:
            writer.close()
        if last + 1 < count:
            for series in sorted(served):
                store.stale(series, last + 1)


def observe_phase_totals(
    state: TrainingState, observed: dict[str, float], totals: Iterable[tuple[str, float]]
) -> dict[str, float]:
    """Feed a rank's recorded phase totals to `state` as the phase times the live API
    observed since the `observed` totals (`TrainingState.observe_phase`, so names are
    admitted and bounded as live); returns the new totals. A total below the one before
    starts again from zero, as a Prometheus counter reset does (a restarted process).

    >>> state = TrainingState()
    >>> seen = observe_phase_totals(state, {}, [("forward", 2.0), ("backward", 3.0)])
    >>> seen = observe_phase_totals(state, seen, [("forward", 2.5), ("backward", 3.0)])
    >>> state.phases["forward"], state.phases["backward"]
    (2.5, 3.0)
    """
    now = dict(observed)
    for name, total in totals:
        before = observed.get(name, 0.0)
        state.observe_phase(name, total - before if total >= before else total)
        now[name] = total
    return now


class _Progress:
    """A one-line progress bar on stderr for long timelines (only on a terminal)."""

    def __init__(self, total: int, enabled: bool, stream=None):
        self.stream = stream or sys.stderr
        self.total, self.done, self.shown = max(total, 1), 0, -1
        self.enabled = enabled and self.stream.isatty() and total > PROGRESS_FROM

    def advance(self, n: int) -> None:
        if not self.enabled or not n:
            return
        self.done += n
        percent = min(100, int(100 * self.done / self.total))
        if percent != self.shown:
            self.shown = percent
            filled = percent // 4
            self.stream.write(
                f"\rreplaying [{'#' * filled}{'.' * (25 - filled)}] {percent:3d}% "
                f"of {self.total:,} samples and steps"
            )
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 72 + "\r")
            self.stream.flush()

"""One run's figures, read off the report's collected numbers (`report.collect.Collected`):
its size, step time, phases, utilisation distributions, GPU memory and rule verdicts.

Everything is per step or per GPU, so runs of different lengths and sizes compare: step
times, phase seconds per step, utilisation distributions pooled over every sample of every
GPU (or node), GPU memory per GPU. Totals are kept for the summary only.

    >>> noise([0.10, 0.11, 0.10, 0.12, 0.10, 0.30, 0.11, 0.10, 0.10, 0.11])
    0.005
"""

from __future__ import annotations

import dataclasses
import math

from trainprof.contract.quantiles import histogram_quantile
from trainprof.dashboards.exprs import SYSTEM_USAGE_NAMES
from trainprof.replay import Verdict as ReplayVerdict
from trainprof.report import usage
from trainprof.report.build import _parameters as parameters_text
from trainprof.report.collect import Collected, Points
from trainprof.rules.status import RuleStatus

# Fewer windowed values than this, and a run's noise is not measured.
MIN_WINDOWS = 5
# The utilisation resources compared, as the report's usage table names them.
RESOURCES = tuple(SYSTEM_USAGE_NAMES.values())
STATISTICS = ("min",) + usage.QUANTILES + ("max",)


@dataclasses.dataclass
class StepTime:
    steps: int
    mean: float | None
    p50: float | None
    p95: float | None
    buckets: list[tuple[float, float]]  # cumulative (upper bound, steps), +Inf last
    # name (mean, p50, p95) -> the statistic over the run, window by window (seconds since
    # the run's start, value): its spread is the run's own noise.
    over_time: dict[str, Points]

    def noise(self, name: str) -> float | None:
        return noise([v for _, v in self.over_time.get(name, [])])

    def shares(self) -> list[tuple[float, float]]:
        """(upper bound, share of the steps) per bucket: the distribution, whatever the
        run's length."""
        total = self.buckets[-1][1] if self.buckets else 0.0
        out, below = [], 0.0
        for le, count in self.buckets:
            out.append((le, (count - below) / total if total else 0.0))
            below = count
        return out


@dataclasses.dataclass
class Verdict:
    """A rule's verdict in one run, as replay's JSON says it."""

    status: str
    fired: bool
    times_triggered: int
    first_fired_at: float | None
    status_detail: RuleStatus | None = None

    @classmethod
    def of(cls, v: ReplayVerdict) -> Verdict:
        return cls(
            v.status.status if v.status else ("fired" if v.fired else "quiet"),
            v.fired,
            len(v.alerts),
            v.first_fired_at,
            v.status,
        )

    def as_json(self) -> dict:
        detail = self.status_detail.as_json() if self.status_detail else {}
        return {
            "status": self.status,
            "fired": self.fired,
            "times_triggered": self.times_triggered,
            "datapoints": detail.get("datapoints"),
            "measured": detail.get("measured"),
            "first_fired_at": _number(self.first_fired_at),
            "reason": self.status_detail.reason if self.status_detail else "",
        }


@dataclasses.dataclass
class RunFigures:
    label: str
    training_job: str
    source: str
    start: float
    end: float
    nodes: int
    gpus: int
    ranks: int
    steps: int
    samples: float | None  # training samples (trainprof.step(samples=...)) over the run
    step_time: StepTime | None
    # phase -> (share of the loop, seconds per step)
    phases: dict[str, tuple[float | None, float | None]]
    # resource (GPU utilization, ...) -> min / p50 / p90 / p95 / p99 / max over every sample
    usage: dict[str, dict[str, float]]
    # resource -> cumulative (upper bound, share of samples at or below it)
    usage_cdf: dict[str, list[tuple[float, float]]]
    gpu_over_time: Points  # the job's GPU utilisation, seconds since start
    gpu_memory_peak_bytes: float | None  # the highest of any GPU
    gpu_memory_total_bytes: float | None
    rules: dict[str, Verdict]
    scrape_interval: float
    parameters: dict[str, str]  # rule -> its parameters as configured, for people
    notes: list[str]

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def summary_json(self) -> dict:
        return {
            "label": self.label,
            "training_job": self.training_job,
            "source": self.source,
            "start": _number(self.start),
            "end": _number(self.end),
            "seconds": _number(self.seconds),
            "nodes": self.nodes,
            "gpus": self.gpus,
            "ranks": self.ranks,
            "steps": self.steps,
            "steps_per_second": _round(self.steps / self.seconds if self.seconds > 0 else None),
            "samples_per_second_per_gpu": _round(
                self.samples / self.seconds / self.gpus
                if self.samples and self.seconds > 0 and self.gpus
                else None
            ),
        }


def figures(label: str, c: Collected) -> RunFigures:
    """The run's figures from what the report collected for it."""
    n = _Read(c)
    steps = int(n.scalar("compare.step_count") or n.scalar("status.steps") or 0)
    return RunFigures(
        label=label,
        training_job=c.training_job,
        source=c.source,
        start=c.start,
        end=c.end,
        nodes=int(n.scalar("summary.nodes") or 0),
        gpus=int(n.scalar("summary.gpus") or 0),
        ranks=int(n.scalar("summary.ranks") or 0),
        steps=steps,
        samples=n.scalar("compare.samples"),
        step_time=_step_time(c, n, steps),
        phases=_phases(n),
        usage=_pooled_usage(n),
        usage_cdf=_usage_cdf(n),
        gpu_over_time=n.relative(c, "compare.gpu"),
        gpu_memory_peak_bytes=n.highest("compare.gpu_memory_peak"),
        gpu_memory_total_bytes=n.highest("compare.gpu_memory_total"),
        rules={name: Verdict.of(v) for name, v in c.verdicts.items()},
        scrape_interval=c.config.scrape_interval,
        parameters={i.spec.name: parameters_text(i) for i in c.config.rules},
        notes=list(c.notes),
    )


def noise(values: list[float]) -> float | None:
    """Half the interquartile range of a statistic measured window by window: how much it
    moves within one run, the run's first and last windows (warm-up, a last step cut short)
    and a profiled step or two weighing little. None with fewer than MIN_WINDOWS values."""
    finite = sorted(v for v in values if math.isfinite(v))
    if len(finite) < MIN_WINDOWS:
        return None

    def at(q: float) -> float:
        pos = q * (len(finite) - 1)
        low = math.floor(pos)
        high = min(low + 1, len(finite) - 1)
        return finite[low] + (finite[high] - finite[low]) * (pos - low)

    return round((at(0.75) - at(0.25)) / 2, 9)


class _Read:
    def __init__(self, c: Collected):
        self.c = c

    def series(self, name: str):
        return self.c.results.get(name, [])

    def scalar(self, name: str) -> float | None:
        for _, points in self.series(name):
            finite = [v for _, v in points if math.isfinite(v)]
            if finite:
                return finite[-1]
        return None

    def highest(self, name: str) -> float | None:
        values = [v for _, points in self.series(name) for _, v in points[-1:] if math.isfinite(v)]
        return max(values) if values else None

    def last_by(self, name: str, label: str) -> dict[str, float]:
        return {
            labels.get(label, ""): points[-1][1]
            for labels, points in self.series(name)
            if points and math.isfinite(points[-1][1])
        }

    def relative(self, c: Collected, name: str) -> Points:
        """The first series of `name` over time, in seconds since the run's start."""
        for _, points in self.series(name):
            return [(t - c.start, v) for t, v in points if math.isfinite(v)]
        return []


def _step_time(c: Collected, n: _Read, steps: int) -> StepTime | None:
    buckets = sorted(
        (float(labels["le"]), points[-1][1])
        for labels, points in n.series("compare.step_buckets")
        if points and "le" in labels and math.isfinite(points[-1][1])
    )
    if not steps or not buckets or buckets[-1][1] <= 0:
        return None
    seconds = n.scalar("compare.step_seconds")
    count = n.scalar("compare.step_count")
    return StepTime(
        steps=steps,
        mean=seconds / count if seconds is not None and count else None,
        p50=_finite(histogram_quantile(0.5, buckets)),
        p95=_finite(histogram_quantile(0.95, buckets)),
        buckets=buckets,
        over_time={name: n.relative(c, f"compare.step_{name}") for name in ("mean", "p50", "p95")},
    )


def _phases(n: _Read) -> dict[str, tuple[float | None, float | None]]:
    shares = n.last_by("framework.phases", "phase")
    per_step = n.last_by("framework.phase_per_step", "phase")
    return {
        phase: (shares.get(phase), per_step.get(phase))
        for phase in sorted(set(shares) | set(per_step))
    }


def _pooled_buckets(n: _Read) -> dict[str, list[tuple[float, float]]]:
    """resource -> cumulative buckets of every sample of the job (all nodes summed)."""
    pooled: dict[str, dict[float, float]] = {}
    for (_, _, resource), buckets in usage.group(n.series("usage.node_buckets")).items():
        into = pooled.setdefault(resource, {})
        for le, count in buckets:
            into[le] = into.get(le, 0.0) + count
    return {r: sorted(b.items()) for r, b in pooled.items()}


def _pooled_usage(n: _Read) -> dict[str, dict[str, float]]:
    out = {}
    for resource, buckets in _pooled_buckets(n).items():
        found = usage.stats(buckets)
        if found is not None:
            out[resource] = found
    return out


def _usage_cdf(n: _Read) -> dict[str, list[tuple[float, float]]]:
    out = {}
    for resource, buckets in _pooled_buckets(n).items():
        total = buckets[-1][1] if buckets else 0.0
        if total > 0:
            out[resource] = [(le, count / total) for le, count in buckets if math.isfinite(le)]
    return out


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _round(x: float | None, digits: int = 6) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, digits)


def _number(value: float | None):
    if value is None:
        return None
    return int(value) if float(value).is_integer() else round(value, 3)

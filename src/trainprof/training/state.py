"""From step and phase observations to the training series: the one step-to-metrics path.

The live training API (`trainprof.step()`, `trainprof.phase()`) and `trainprof replay` (steps
read from SageMaker framework traces) both feed a `TrainingState` and read its metric families,
so StepOutlier, MaxInitializationTime and OverallFrameworkMetrics see the same series whether
the steps ran a moment ago or were recorded last year. No clocks, no threads, no I/O: times are
given in Unix seconds.

    >>> state = TrainingState({"rank": "0", "local_rank": "0"}, start_time=1000.0)
    >>> for i in range(101):
    ...     state.observe_step("train", 1010.0 + i, 1010.1 + i + (5.0 if i == 100 else 0.0))
    >>> state.value("trainprof_training_steps_total", mode="train")
    101
    >>> state.value("trainprof_training_step_outliers_total", mode="train", stddev="3")
    1
    >>> state.value("trainprof_training_first_step_timestamp_seconds")
    1010.0

StepOutlier is exact and incremental: once a mode has had `OUTLIER_MIN_STEPS` steps, each new
step is compared with the mean plus k population standard deviations of *all earlier* steps of
that mode (Welford's running mean and variance, O(1) per step), for every factor k of the grid.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import logging
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.core import Metric as MetricFamily

from trainprof.contract import metrics as contract
from trainprof.contract.metrics import threshold_label
from trainprof.contract.sampling import Families, add_histogram, bucket_labels, sample_value

log = logging.getLogger("trainprof")

# SageMaker's StepOutlier only judged a mode once it had more than 100 steps (hard-coded).
OUTLIER_MIN_STEPS = 100

# Label values longer than this are cut and given a hash suffix, so they stay distinct and a
# hostile environment variable cannot blow up every series of the job.
MAX_LABEL_VALUE_LENGTH = 128
MAX_PHASE_NAME_LENGTH = 64

# The mode whose series are exported from the start (at zero), so rate() and the StepOutlier
# rule have an input before the first step; other modes appear with their first step.
EAGER_MODES = ("train",)

# Phase that receives a step's time not spent in any phase nested inside it.
STEP_REMAINDER_PHASE = {
    "train": "other",
    "eval": "evaluation",
    "predict": "evaluation",
    "global": "other",
}

_MODE_ALIASES = {
    "train": "train",
    "training": "train",
    "fit": "train",
    "eval": "eval",
    "evaluation": "eval",
    "evaluate": "eval",
    "validation": "eval",
    "validate": "eval",
    "val": "eval",
    "valid": "eval",
    "test": "eval",
    "predict": "predict",
    "prediction": "predict",
    "inference": "predict",
    "global": "global",
}


def canonical_mode(name: str) -> str:
    """The contract's mode for a framework's spelling; ValueError names the valid ones.

    >>> [canonical_mode(m) for m in ("ModeKeys.TRAIN", "Step:ModeKeys.EVAL", "val")]
    ['train', 'eval', 'eval']
    """
    key = str(name).strip().lower()
    key = key.rpartition("modekeys.")[2] if "modekeys." in key else key
    try:
        return _MODE_ALIASES[key]
    except KeyError:
        raise ValueError(
            f"unknown mode {name!r}; expected one of {', '.join(contract.MODES)}"
        ) from None


def _count(what: str, n: float) -> float:
    """A finite, non-negative amount to add to a counter; one NaN or infinity would stay in
    the counter forever, so it is refused (and counted as an instrumentation error)."""
    value = float(n)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite number of at least 0, got {n!r}")
    return value


def bounded_label_value(value: object, limit: int = MAX_LABEL_VALUE_LENGTH) -> str:
    """A label value that any scrape can carry: valid UTF-8, at most `limit` characters.

    Environment variables may hold bytes that are not UTF-8 (Python keeps them as lone
    surrogates, which would make every scrape fail to encode); they become U+FFFD. A longer
    value keeps its start and gets a hash of the whole, so two long values stay distinct.

    >>> bounded_label_value("x" * 200)[-10:]
    'xx~aa20c23'
    """
    text = str(value).encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if len(text) <= limit:
        return text
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:7]
    return text[: limit - 8] + "~" + digest


class StepStatistics:
    """One mode's steps: the duration histogram and the exact outlier counters.

    `counts` are per-bucket (not cumulative) over `metrics.STEP_DURATION_BUCKETS`, the last
    slot is +Inf; `factors` are the stddev factors counted, ascending, and `outliers[i]`
    counts factor i. `mean` and `m2` are Welford's running mean and sum of squared
    deviations of all durations so far.
    """

    __slots__ = ("factors", "outliers", "counts", "sum", "count", "mean", "m2")

    bounds = contract.STEP_DURATION_BUCKETS

    def __init__(self, factors: tuple[float, ...]):
        self.factors = factors
        self.outliers = [0] * len(factors)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0

    def observe(self, duration: float) -> None:
        self.observe_spans(((None, 0.0, duration),), None, None)

    def observe_spans(
        self, spans: Iterable[tuple], first: float | None, last: float | None
    ) -> tuple[float | None, float | None]:
        """A run of steps `(_, start, end)`, in the order they ended, after steps that
        began at `first` and ended at `last` at the latest (None: no step yet); returns
        those two with the run's steps. One attribute read and write per run, not per
        step: the live API folds its steps in runs (`TrainingState.fold_steps`)."""
        n, mean, m2, total = self.count, self.mean, self.m2, self.sum
        counts, bounds, factors, outliers = self.counts, self.bounds, self.factors, self.outliers
        least = OUTLIER_MIN_STEPS
        for _, start, end in spans:
            duration = end - start
            if not duration > 0.0:
                duration = 0.0  # clocks can step backwards
            excess = duration - mean
            if n >= least and excess > 0.0:
                # duration > mean + k*std  <=>  excess**2 > k**2 * variance, for excess > 0;
                # squares spare a sqrt per step. Population variance of the n earlier steps.
                variance = m2 / n
                square = excess * excess
                for i, k in enumerate(factors):
                    if square <= k * k * variance:
                        break  # factors ascend, so no larger one counts either
                    outliers[i] += 1
            counts[bisect.bisect_left(bounds, duration)] += 1
            total += duration
            n += 1
            mean += excess / n
            m2 += excess * (duration - mean)
            if last is None:
                first, last = start, end
            elif end > last:
                last = end
        self.count, self.mean, self.m2, self.sum = n, mean, m2, total
        return first, last

    def with_factors(self, factors: tuple[float, ...]) -> StepStatistics:
        """These statistics counting `factors`; a factor new here starts counting at zero."""
        other = self.copy()
        old = dict(zip(self.factors, self.outliers))
        other.factors = factors
        other.outliers = [old.get(k, 0) for k in factors]
        return other

    def copy(self) -> StepStatistics:
        other = StepStatistics(self.factors)
        other.outliers = list(self.outliers)
        other.counts = list(self.counts)
        other.sum, other.count, other.mean, other.m2 = self.sum, self.count, self.mean, self.m2
        return other

    def add_to(self, family: HistogramMetricFamily, labels: list[str]) -> None:
        add_histogram(family, labels, bucket_labels(self.bounds), self.counts, self.count, self.sum)


class TrainingState:
    """Folds steps and phases into the training metric families of one rank.

    `identity` holds the identity labels this process emits (a subset of
    `metrics.TRAINING_IDENTITY`); `info` the labels of `trainprof_training_info`. Not
    thread-safe: the live API serialises calls with its own lock.
    """

    def __init__(
        self,
        identity: Mapping[str, str] | None = None,
        *,
        stddevs: Iterable[float] = (),
        start_time: float | None = None,
        info: Mapping[str, str] | None = None,
    ):
        self.identity = {k: bounded_label_value(v) for k, v in (identity or {}).items()}
        self.info = dict.fromkeys(contract.metric(contract.TRAINING_INFO).labels, "")
        self.info.update((k, bounded_label_value(v)) for k, v in (info or {}).items())
        self.start_time = start_time
        self.factors = _factor_grid(stddevs)
        self.modes: dict[str, StepStatistics] = {
            m: StepStatistics(self.factors) for m in EAGER_MODES
        }
        self.phases: dict[str, float] = dict.fromkeys(contract.PHASES, 0.0)
        self.user_phases = 0
        self.first_step_time: float | None = None
        self.last_step_time: float | None = None
        self.samples = 0.0
        self.tokens = 0.0
        self.errors = 0
        self.gpus: list[tuple[str, str]] = []
        self.dataloader_workers: int | None = None

    # --- observations --------------------------------------------------------------------

    def observe_step(self, mode: str, start: float, end: float) -> None:
        """One step of `mode` (a name of `metrics.MODES`) from `start` to `end`, Unix seconds."""
        self.observe_steps(mode, ((None, start, end),))

    def observe_steps(self, mode: str, spans: Iterable[tuple]) -> None:
        """Steps of `mode` in the order they ended, `(_, start, end)` each (Unix seconds)."""
        stats = self.modes.get(mode)
        if stats is None:
            if mode not in contract.MODES:
                raise ValueError(
                    f"unknown mode {mode!r}; expected one of {', '.join(contract.MODES)}"
                )
            stats = self.modes[mode] = StepStatistics(self.factors)
        self.first_step_time, self.last_step_time = stats.observe_spans(
            spans, self.first_step_time, self.last_step_time
        )

    def observe_phase(self, name: str, seconds: float) -> str:
        """Add `seconds` to a phase; returns the phase it was counted under.

        A name outside `metrics.PHASES` is a user annotation. At most `MAX_USER_PHASES`
        distinct ones are kept (cut to `MAX_PHASE_NAME_LENGTH` characters); later new names
        are counted under "other", with one log line, so a name built from a step number
        cannot grow the series without bound.
        """
        phases = self.phases
        if name not in phases:
            name = self._admit_phase(name)
        phases[name] += seconds if seconds > 0.0 else 0.0
        return name

    def _admit_phase(self, name: str) -> str:
        label = bounded_label_value(name, MAX_PHASE_NAME_LENGTH)
        if label in self.phases:
            return label
        if self.user_phases >= contract.MAX_USER_PHASES:
            if self.user_phases == contract.MAX_USER_PHASES:
                log.warning(
                    "trainprof: more than %d phase names; phase %r and later new "
                    "names are counted as 'other'",
                    contract.MAX_USER_PHASES,
                    label,
                )
                self.user_phases += 1
            return "other"
        self.user_phases += 1
        self.phases[label] = 0.0
        return label

    def fold_steps(self, steps: Sequence[tuple], failed: Callable[[], None]) -> None:
        """The live API's steps (`timing.HotPath.pending`) in the order they ended: `(step,
        start, end)`, `step` giving its `mode` and the `samples` and `tokens` it adds; the
        same as `observe_step` (then `add_samples`, `add_tokens`) for each, a run of one
        step object's steps at once. A run that fails is counted as an instrumentation error
        (`failed` logs it) and the rest are folded."""
        for step, run in itertools.groupby(steps, key=operator.itemgetter(0)):
            try:
                if not (step.samples or step.tokens):
                    self.observe_steps(step.mode, run)
                    continue
                for _, start, end in run:
                    self.observe_step(step.mode, start, end)
                    if step.samples:
                        self.add_samples(step.samples)
                    if step.tokens:
                        self.add_tokens(step.tokens)
            except Exception:
                self.errors += 1
                failed()

    def phase_label(self, name: str) -> str:
        """The phase `name`'s time is counted under (see `observe_phase`), admitted now."""
        return name if name in self.phases else self._admit_phase(name)

    def add_samples(self, n: float) -> None:
        self.samples += _count("samples", n)

    def add_tokens(self, n: float) -> None:
        self.tokens += _count("tokens", n)

    def add_stddevs(self, stddevs: Iterable[float]) -> None:
        """Count outliers for more factors too, from now on (earlier steps are not recounted)."""
        factors = _factor_grid(tuple(self.factors) + tuple(stddevs))
        if factors != self.factors:
            self.factors = factors
            self.modes = {m: s.with_factors(factors) for m, s in self.modes.items()}

    def set_gpus(self, gpus: Iterable[tuple[str, str]]) -> None:
        """The GPUs this rank uses, as (index, uuid) pairs."""
        self.gpus = [(bounded_label_value(i), bounded_label_value(u)) for i, u in gpus]

    def set_dataloader_workers(self, workers: int) -> None:
        """The worker processes of the data loader the loop iterates (its num_workers)."""
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise ValueError(f"dataloader workers must be a whole number >= 0, got {workers!r}")
        self.dataloader_workers = workers

    def count_error(self, n: int = 1) -> None:
        self.errors += n

    def copy(self) -> TrainingState:
        """A snapshot, so families can be rendered without holding up the training loop."""
        other = TrainingState.__new__(TrainingState)
        other.__dict__.update(self.__dict__)
        other.identity, other.info = dict(self.identity), dict(self.info)
        other.modes = {m: s.copy() for m, s in self.modes.items()}
        other.phases = dict(self.phases)
        other.gpus = list(self.gpus)
        return other

    # --- rendering -----------------------------------------------------------------------

    def families(self) -> Iterator[MetricFamily]:
        """Every training metric family of this state, as prometheus_client objects."""
        ident_names = [k for k in contract.TRAINING_IDENTITY if k in self.identity]
        ident = [self.identity[k] for k in ident_names]
        fam = Families(ident_names)

        info = [k for k in contract.metric(contract.TRAINING_INFO).labels if k in self.info]
        yield fam.gauge(contract.TRAINING_INFO, info, [(ident + [self.info[k] for k in info], 1)])
        yield from fam.known(contract.TRAINING_START_TIMESTAMP_SECONDS, ident, self.start_time)
        yield from fam.known(
            contract.TRAINING_FIRST_STEP_TIMESTAMP_SECONDS, ident, self.first_step_time
        )
        yield from fam.known(
            contract.TRAINING_LAST_STEP_TIMESTAMP_SECONDS, ident, self.last_step_time
        )

        modes = [(m, self.modes[m]) for m in contract.MODES if m in self.modes]
        yield fam.counter(
            contract.TRAINING_STEPS_TOTAL, ["mode"], [(ident + [m], s.count) for m, s in modes]
        )
        yield fam.histogram(
            contract.TRAINING_STEP_DURATION_SECONDS,
            ["mode"],
            [(ident + [m], s) for m, s in modes],
        )
        yield fam.counter(
            contract.TRAINING_STEP_OUTLIERS_TOTAL,
            ["mode", "stddev"],
            [
                (ident + [m, threshold_label(k)], n)
                for m, s in modes
                for k, n in zip(s.factors, s.outliers)
            ],
        )
        yield fam.counter(
            contract.TRAINING_PHASE_SECONDS_TOTAL,
            ["phase"],
            [(ident + [p], v) for p, v in self.phases.items()],
        )
        yield from fam.known(contract.TRAINING_DATALOADER_WORKERS, ident, self.dataloader_workers)
        yield fam.counter(contract.TRAINING_SAMPLES_TOTAL, [], [(ident, self.samples)])
        yield fam.counter(contract.TRAINING_TOKENS_TOTAL, [], [(ident, self.tokens)])
        if self.gpus:
            yield fam.gauge(
                contract.GPU_ASSIGNMENT_INFO,
                ["gpu", "uuid"],
                [(ident + [i, u], 1) for i, u in self.gpus],
            )
        yield fam.counter(contract.INSTRUMENTATION_ERRORS_TOTAL, [], [(ident, self.errors)])

    def value(self, name: str, **labels: str) -> float | None:
        """One sample's value by exposed sample name and labels (tests and debugging)."""
        return sample_value(self.families(), name, **labels)

    def row(self) -> tuple[tuple, list[float]]:
        """(shape, values): the value of each sample `families()` gives, in its order,
        without building them; samples of equal shapes have equal names and labels (as
        `SampleAccumulator.row`, for replay)."""
        values: list[float] = [1]
        times = (self.start_time, self.first_step_time, self.last_step_time)
        values += [t for t in times if t is not None]
        modes = [self.modes[m] for m in contract.MODES if m in self.modes]
        values += [s.count for s in modes]
        for stats in modes:
            cumulative = list(itertools.accumulate(stats.counts))
            cumulative[-1] = stats.count
            values += cumulative
            values.append(stats.count)
            values.append(stats.sum)
        for stats in modes:
            values += stats.outliers
        values += self.phases.values()
        if self.dataloader_workers is not None:
            values.append(self.dataloader_workers)
        values.append(self.samples)
        values.append(self.tokens)
        values += [1] * len(self.gpus)
        values.append(self.errors)
        shape = (
            tuple(self.identity.items()),
            tuple(self.info.items()),
            tuple(t is None for t in times),
            tuple(m for m in contract.MODES if m in self.modes),
            tuple(s.factors for s in modes),
            tuple(self.phases),
            self.dataloader_workers is None,
            tuple(self.gpus),
        )
        return shape, values


def _factor_grid(extra: Iterable[float]) -> tuple[float, ...]:
    factors = set(contract.OUTLIER_STDDEVS)
    for k in extra:
        k = float(k)
        if not k > 0 or math.isinf(k):
            raise ValueError(f"a stddev factor must be a positive number, got {k!r}")
        factors.add(k)
    return tuple(sorted(factors))

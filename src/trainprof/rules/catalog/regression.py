"""Regression rules, beyond SageMaker's: StepTimeRegression, GPUUtilizationRegression.

Each compares a job's current value (its mean over the last `window` minutes) with a
baseline run's: a named job (`baseline`: its training_job), or, by default, the previous run
of the same job name. A run is what the report and replay call one: the job's processes
since its earliest process started (`trainprof_training_start_timestamp_seconds`); a new
start time is a new run.

A baseline outlives its run, so the rules keep, per job, what they learnt about its runs
in recordings that read their own last value (Prometheus evaluates a group's rules in order,
and a recording sees its own previous sample):

- `mean_rate<window>`: the current value (step time: sum over count of the step histogram;
  GPU utilisation: every sample of every GPU of the job);
- `run_start`: the run's start (its earliest process start);
- `previous_run_mean`: when a new run starts, the mean the last run ended with, kept for
  the whole new run;
- `run_mean`, `run_evaluations`: the running mean of the current value over the run's
  evaluations, and how many there were;
- `last_run_start`, `last_run_mean`, `last_seen`: the run seen last, and when; what a run
  that ended leaves behind (and what a named baseline reads), forgotten `memory_days` after
  the job was last seen.

The alert compares the current value with the baseline's mean for `patience` minutes:
step time above it by more than `threshold` percent; GPU utilisation below it by more than
`threshold` percentage points. A job without a baseline (its first run) has no verdict.
Neither rule is part of ProfilerReport: they are trainprof's own (configure them as rules of
their own), and their self-reading recordings make replay evaluate a long job in one pass.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from trainprof.contract import metrics as contract
from trainprof.contract.durations import format_duration
from trainprof.rules.catalog._text import JOB
from trainprof.rules.model import (
    RATIO_UNIT,
    Alert,
    Build,
    Recording,
    Recordings,
    RuleOutput,
    RuleSpec,
    Selects,
    Signal,
    Threshold,
    indent,
)
from trainprof.rules.params import MINUTES, MODE, PERCENT, Kind, param, scan_interval_param
from trainprof.rules.params import _number as number
from trainprof.rules.promql import Matcher, selector
from trainprof.rules.tensor_params import TEXT

_STEP = contract.TRAINING_STEP_DURATION_SECONDS
_UTIL = contract.GPU_UTILIZATION_SAMPLED_RATIO
_START = contract.TRAINING_START_TIMESTAMP_SECONDS


def _days(value):
    result = number(value)
    if not 0 < result <= 3650:
        raise ValueError(f"{value!r} is not a number of days between 0 and 3650")
    return result


DAYS = Kind("days", "d", _days, "days")
_BASELINE = (
    "The baseline job's training_job; empty: the previous run of the same job name "
    "(told apart by its start time)."
)
_MEMORY = "Days a run stays a baseline after its job was last seen."


@dataclasses.dataclass(frozen=True)
class StepTimeRegressionParams:
    threshold: float = param(
        10, PERCENT, "Percent above the baseline's mean step time that fires the rule.", True
    )
    window: float = param(5, MINUTES, "Minutes the current mean step time covers.", True)
    patience: float = param(
        10, MINUTES, "Minutes the step time must stay that slow before the rule fires.", True
    )
    baseline: str | None = param(None, TEXT, _BASELINE, True)
    mode: str | None = param(
        "train", MODE, "Only steps of this mode count; empty for all modes.", True
    )
    memory_days: float = param(30, DAYS, _MEMORY, True)
    scan_interval_us: int = scan_interval_param()


@dataclasses.dataclass(frozen=True)
class GPUUtilizationRegressionParams:
    threshold: float = param(
        10,
        PERCENT,
        "Percentage points below the baseline's mean GPU utilization that fire the rule.",
        True,
    )
    window: float = param(5, MINUTES, "Minutes the current mean utilization covers.", True)
    patience: float = param(
        10, MINUTES, "Minutes the utilization must stay that low before the rule fires.", True
    )
    baseline: str | None = param(None, TEXT, _BASELINE, True)
    memory_days: float = param(30, DAYS, _MEMORY, True)
    scan_interval_us: int = scan_interval_param()


@dataclasses.dataclass(frozen=True)
class RunBaseline:
    """The recordings that learn one signal's baseline runs (see the module docstring)."""

    now: Recording
    start: Recording
    previous: Recording
    run_mean: Recording
    evaluations: Recording
    last_start: Recording
    last_mean: Recording
    seen: Recording

    @property
    def recordings(self) -> tuple[Recording, ...]:
        # The order is the evaluation order the expressions rely on: what reads the last
        # evaluation's run start and mean comes before what updates them.
        return (
            self.now,
            self.start,
            self.previous,
            self.run_mean,
            self.evaluations,
            self.last_start,
            self.last_mean,
            self.seen,
        )

    @classmethod
    def of(
        cls, b: Build, metric: str, now: str, start: str, memory_days: float, window: str
    ) -> RunBaseline:
        """`now`: the current value per job; `start`: the run's start per job (recorded
        once, read by the recordings after it)."""
        on = b.on_job

        def rec(operation: str, expr: str) -> Recording:
            return Recording("training_job", metric, operation, expr)

        current = rec(f"mean_rate{window}", now)
        x = current.record
        run_start = rec("run_start", start)
        start = run_start.record
        names = {
            op: f"training_job:{metric}:{op}"
            for op in (
                "previous_run_mean",
                "run_mean",
                "run_evaluations",
                "last_run_start",
                "last_run_mean",
                "last_seen",
            )
        }
        prev, mean, n = names["previous_run_mean"], names["run_mean"], names["run_evaluations"]
        last_start, last_mean, seen = (
            names["last_run_start"],
            names["last_run_mean"],
            names["last_seen"],
        )
        forgotten = f"(time() - {seen} > {memory_days * 86400:g})"
        same_run = f"({start}\n== {on}\n{last_start})"
        return cls(
            current,
            run_start,
            rec(
                "previous_run_mean",
                f"(\n  {last_mean}\n  and {on}\n  ({start}\n  > {on}\n  {last_start})\n)\n"
                f"or\n({prev} unless {on} {forgotten})",
            ),
            rec(
                "run_mean",
                f"(\n  ({mean} * {n} + {x}) / ({n} + 1)\n  and {on}\n{indent(same_run)}\n)\n"
                f"or\n({x} and {on} {start})\n"
                f"or\n({mean} and {on}\n{indent(same_run)})",
            ),
            rec(
                "run_evaluations",
                f"(\n  {n} + 1\n  and {on} {x}\n  and {on}\n{indent(same_run)}\n)\n"
                f"or\n({x} * 0 + 1 and {on} {start})\n"
                f"or\n({n} and {on}\n{indent(same_run)})",
            ),
            rec("last_run_start", f"{start}\nor\n({last_start} unless {on} {forgotten})"),
            rec("last_run_mean", f"{mean}\nor\n({last_mean} unless {on} {forgotten})"),
            rec("last_seen", f"({x} * 0 + time())\nor\n({seen} unless {on} {forgotten})"),
        )

    def baseline(self, b: Build, name: str | None) -> str:
        """The baseline each job's current value is compared with, matched to the job."""
        if not name:
            return self.previous.record
        named = selector(self.last_mean.record, [Matcher("training_job", "=", name)])
        return f"on () group_left ()\nmax({named})"

    def current(self, name: str | None) -> str:
        """The jobs the rule judges: all, but a named baseline itself."""
        if not name:
            return self.now.record
        return selector(self.now.record, [Matcher("training_job", "!=", name)])


def _window(b: Build, minutes: float, param_name: str) -> str:
    seconds = minutes * 60
    minimum = 2 * b.scrape_interval
    if seconds < minimum:
        b.warnings.append(
            f"{b.path(param_name)}: {b.rule.name}'s {param_name} of {minutes:g} min is "
            f"shorter than two scrape intervals; using {format_duration(minimum)}"
        )
    return format_duration(max(seconds, minimum))


def _step_mode(b: Build[StepTimeRegressionParams]) -> dict[str, str]:
    return {"mode": b.p.mode} if b.p.mode else {}


def _step_baseline(b: Build[StepTimeRegressionParams]) -> RunBaseline:
    p = b.p
    window = _window(b, p.window, "window")
    jl = ", ".join(b.job_labels)
    total = f"rate({b.sel(_STEP + '_sum', **_step_mode(b))}[{window}])"
    count = f"rate({b.sel(_STEP + '_count', **_step_mode(b))}[{window}])"
    now = f"sum by ({jl}) ({total})\n/\n(sum by ({jl}) ({count}) > 0)"
    start = f"min by ({jl}) ({b.sel(_START)})"
    return RunBaseline.of(b, _STEP, now, start, p.memory_days, window)


def _step_time_regression(b: Build[StepTimeRegressionParams]) -> RuleOutput:
    p = b.p
    runs = _step_baseline(b)
    against = "the previous run's" if not p.baseline else f"job {p.baseline}'s"
    limit = 1 + p.threshold / 100
    return RuleOutput(
        runs.recordings,
        (
            Alert(
                expr=f"{runs.current(p.baseline)}\n/ {runs.baseline(b, p.baseline)}\n> {limit:g}",
                for_seconds=p.patience * 60,
                summary="Training steps are slower than in the baseline run.",
                description=(
                    f"Job {JOB}'s mean step time over the last {format_duration(p.window * 60)} "
                    f"is {{{{ $value | humanizePercentage }}}} of {against} mean (the rule "
                    f"fires above {limit * 100:g}%)."
                ),
                labels={"baseline": p.baseline or "previous_run"},
            ),
        ),
    )


def _against_baseline(
    title: str,
    op: str,
    threshold: Callable[[float], Threshold],
    make: Callable[[Build], RunBaseline],
):
    """`signals=`: the job's current value `op` (/ or -) its baseline's, against the line
    the alert compares it with."""

    def signals(b: Build, out: RuleOutput, scope: Selects, _: Recordings) -> tuple[Signal, ...]:
        runs = make(dataclasses.replace(b, warnings=[]))
        name = b.p.baseline
        mine = scope.sel(runs.now.record)
        if name:
            theirs = selector(runs.last_mean.record, [Matcher("training_job", "=", name)])
            expr = f"{mine}\n{op} on () group_left ()\nmax({theirs})"
        else:
            expr = f"{mine}\n{op} {b.on_job}\n{scope.sel(runs.previous.record)}"
        return (Signal(title, expr, "{{training_job}}", RATIO_UNIT, threshold(b.p.threshold)),)

    return signals


STEP_TIME_REGRESSION = RuleSpec(
    name="StepTimeRegression",
    summary="Steps slower than in a baseline run",
    detects=(
        "The job's mean step time over the last `window` minutes (steps of `mode`) against "
        "the mean step time of a baseline run: the previous run of the same job name, or "
        "the job named in `baseline`. More than `threshold` percent slower for `patience` "
        "minutes is a regression: a change to the code, the data, the libraries or the "
        "machines made each step take longer."
    ),
    recommendation=(
        "Compare the two runs (trainprof compare, or the compare dashboard) to see where the "
        "time moved: a phase that grew (data loading, the optimizer, a collective), lower "
        "GPU utilization, or a change in the kernels of a profiled step."
    ),
    severity="warning",
    parameters=StepTimeRegressionParams,
    build=_step_time_regression,
    signals=_against_baseline(
        "Step time relative to the baseline run's mean",
        "/",
        lambda threshold: Threshold(
            1 + threshold / 100, f"threshold = {threshold:g}% slower", "above"
        ),
        _step_baseline,
    ),
    reads_exporter=False,
    family="framework",
    datapoints="steps",
    profiler_report=False,
    differences=(
        "No SageMaker rule compares runs: this one is trainprof's own. The baseline's mean "
        "is the mean of its windowed means over its run; a job's first run, or a run whose "
        "baseline was forgotten, has no verdict. A Prometheus restarted for longer than the "
        "lookback (5 minutes) forgets the baselines it learnt."
    ),
)


def _gpu_baseline(b: Build[GPUUtilizationRegressionParams]) -> RunBaseline:
    p = b.p
    window = _window(b, p.window, "window")
    jl = ", ".join(b.job_labels)
    gauge = b.gauge(_UTIL)
    if gauge is not None:
        now = f"avg by ({jl}) (avg_over_time({gauge}[{window}]))"
    else:
        count = f"sum by ({jl}) (rate({b.sel(_UTIL + '_count')}[{window}]))"
        now = f"sum by ({jl}) (rate({b.sel(_UTIL + '_sum')}[{window}]))\n/\n({count} > 0)"
    # A job without the training API is one run for as long as it is seen.
    start = (
        f"min by ({jl}) ({b.sel(_START)})\nor {b.on_job}\n"
        f"count by ({jl}) ({gauge or b.sel(_UTIL + '_count')}) * 0"
    )
    return RunBaseline.of(b, _UTIL, now, start, p.memory_days, window)


def _gpu_utilization_regression(b: Build[GPUUtilizationRegressionParams]) -> RuleOutput:
    p = b.p
    runs = _gpu_baseline(b)
    against = "the previous run's" if not p.baseline else f"job {p.baseline}'s"
    return RuleOutput(
        runs.recordings,
        (
            Alert(
                expr=(
                    f"{runs.current(p.baseline)}\n- {runs.baseline(b, p.baseline)}\n"
                    f"< -{p.threshold / 100:g}"
                ),
                for_seconds=p.patience * 60,
                summary="GPU utilization is lower than in the baseline run.",
                description=(
                    f"Job {JOB}'s GPU utilization over the last "
                    f"{format_duration(p.window * 60)} differs from {against} mean by "
                    f"{{{{ $value | humanizePercentage }}}} (the rule fires below "
                    f"-{p.threshold:g} percentage points)."
                ),
                labels={"baseline": p.baseline or "previous_run"},
            ),
        ),
    )


GPU_UTILIZATION_REGRESSION = RuleSpec(
    name="GPUUtilizationRegression",
    summary="GPUs busier in a baseline run",
    detects=(
        "The job's mean GPU utilization over the last `window` minutes (every sample of "
        "every GPU of the job) against the mean of a baseline run: the previous run of the "
        "same job name, or the job named in `baseline`. More than `threshold` percentage "
        "points lower for `patience` minutes is a regression: the GPUs wait more than they "
        "used to."
    ),
    recommendation=(
        "Compare the two runs (trainprof compare, or the compare dashboard): a slower input "
        "pipeline (CPUBottleneck, IOBottleneck, the dataloader phase), a smaller batch, more "
        "communication, or a change of machines."
    ),
    severity="warning",
    parameters=GPUUtilizationRegressionParams,
    build=_gpu_utilization_regression,
    signals=_against_baseline(
        "GPU utilization minus the baseline run's mean",
        "-",
        lambda threshold: Threshold(
            -threshold / 100, f"threshold = {threshold:g} points lower", "below"
        ),
        _gpu_baseline,
    ),
    family="gpu",
    profiler_report=False,
    differences=(
        "No SageMaker rule compares runs: this one is trainprof's own. The baseline's mean "
        "is the mean of its windowed means over its run; without trainprof's training API "
        "(no process start time) a job is one run for as long as it is seen, so only a "
        "named baseline applies. A Prometheus restarted for longer than the lookback "
        "(5 minutes) forgets the baselines it learnt."
    ),
)

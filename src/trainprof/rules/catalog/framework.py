"""Rules over the training process: MaxInitializationTime, StepOutlier, Dataloader,
OverallFrameworkMetrics."""

from __future__ import annotations

import dataclasses

from trainprof.contract import metrics as contract
from trainprof.contract.names import (
    JOB_LABEL,
    NOT_STARTED_ALERT,
    RECORDED_INITIALIZATION,
    RECORDED_PHASE,
)
from trainprof.rules.catalog._text import JOB
from trainprof.rules.model import (
    NUMBER_UNIT,
    RATIO_UNIT,
    SECONDS_UNIT,
    Alert,
    Build,
    Population,
    Recording,
    Recordings,
    RuleOutput,
    RuleSpec,
    Selects,
    Signal,
    StateAlert,
    Threshold,
    Units,
)
from trainprof.rules.params import (
    COUNT,
    FACTOR,
    MINUTES,
    MODE,
    OUTLIERS,
    Kind,
    SummaryParams,
    param,
    scan_interval_param,
)
from trainprof.rules.params import _number as number
from trainprof.rules.promql import selector


@dataclasses.dataclass(frozen=True)
class MaxInitializationTimeParams:
    threshold: float = param(20, MINUTES, "Minutes to wait for the first step.")
    scan_interval_us: int = scan_interval_param()


@dataclasses.dataclass(frozen=True)
class StepOutlierParams:
    stddev: float = param(
        3, FACTOR, "A step slower than mean + stddev x standard deviation is an outlier."
    )
    mode: str | None = param(
        None, MODE, "Only count steps of this mode (train, eval); empty for all modes."
    )
    n_outliers: int = param(10, OUTLIERS, "Outliers tolerated before the rule fires.")
    scan_interval_us: int = scan_interval_param()


def _max_initialization(b: Build[MaxInitializationTimeParams]) -> RuleOutput:
    p = b.p
    age = f"max {b.by_job} (time() - {b.sel('trainprof_training_start_timestamp_seconds')})"
    stepped = f"sum {b.by_job} ({b.sel('trainprof_training_steps_total')}) > 0"
    return RuleOutput(
        (),
        (
            Alert(
                expr=f"{age}\n> {p.threshold * 60:g}\nunless {b.on_job}\n{stepped}",
                # Once a rank has stepped the condition is over for good: nothing to hold.
                hold=0,
                summary="Training has not started its first step.",
                description=(
                    f"Job {JOB} started {{{{ $value | humanizeDuration }}}} ago and no rank has "
                    f"completed a step yet (threshold {p.threshold:g} minutes)."
                ),
            ),
        ),
    )


def _max_initialization_signals(
    b: Build[MaxInitializationTimeParams], out: RuleOutput, scope: Selects, recordings: Recordings
) -> tuple[Signal, ...]:
    """Reads OverallFrameworkMetrics' recording: a MissingRecording without it."""
    p = b.p
    initialization = recordings.recording(RECORDED_INITIALIZATION, level=JOB_LABEL)
    jl = ", ".join(b.job_labels)
    age = f"max {scope.by_job} (time() - {scope.sel('trainprof_training_start_timestamp_seconds')})"
    stepped = f"sum {scope.by_job} ({scope.sel('trainprof_training_steps_total')}) > 0"
    return (
        Signal(
            "Time from start to the first step (time since start while there is none)",
            f"{scope.sel(initialization.record)}\nor\n({age}\nunless on ({jl})\n{stepped})",
            "{{training_job}}",
            SECONDS_UNIT,
            Threshold(p.threshold * 60, f"threshold = {p.threshold:g} min", "above"),
        ),
    )


def _not_started(b: Build[MaxInitializationTimeParams]) -> tuple[StateAlert, ...]:
    """From a job's first training process until its first step.

    Fires at once, so Alertmanager can hold back the host and GPU verdicts of a job that is
    still loading: they describe initialization, which MaxInitializationTime judges.
    """
    start = b.sel(contract.TRAINING_START_TIMESTAMP_SECONDS)
    steps = b.sel(contract.TRAINING_STEPS_TOTAL)
    return (
        StateAlert(
            NOT_STARTED_ALERT,
            f"max {b.by_job} (time() - {start})\nunless {b.on_job}\nsum {b.by_job} ({steps}) > 0",
            summary="A training job has not completed its first step yet.",
            description=(
                "Job {{ $labels.training_job }} started {{ $value | "
                "humanizeDuration }} ago and is still initializing; its host "
                "and GPU alerts are held back until its first step."
            ),
            why="a job that has not completed its first step is initializing",
        ),
    )


MAX_INITIALIZATION_TIME = RuleSpec(
    name="MaxInitializationTime",
    datapoints="ranks",
    summary="No training step long after start",
    detects=(
        "Time since the job's oldest training process started, while no rank of the job has "
        "completed a step. Beyond `threshold` minutes the job is stuck in initialization: "
        "downloading data or weights, compiling, or waiting for peers."
    ),
    recommendation=(
        "Look at what the job does before its first step: dataset download or indexing, "
        "model download, torch.compile, or a rendezvous waiting for ranks that never came. "
        "Stream or cache the data, warm the compilation cache, and check that every rank "
        "could start."
    ),
    severity="critical",
    parameters=MaxInitializationTimeParams,
    build=_max_initialization,
    signals=_max_initialization_signals,
    state=_not_started,
    reads_exporter=False,
    family="framework",
    # A job that has not stepped yet idles its GPUs and keeps its CPUs busy loading: every
    # host and GPU verdict about it is noise until it starts.
    inhibits=("bottleneck", "gpu"),
    differences=(
        "The job's start is the start of its oldest training process "
        "(`trainprof_training_start_timestamp_seconds`), not the minute-floored first system "
        "sample, and a step anywhere in the job counts, as in the original. It is evaluated "
        "every `scan_interval_us`, so it fires within one interval of the deadline. Inside "
        "SageMaker's ProfilerReport this rule could never fire (a bug); in trainprof it "
        "fires there too."
    ),
)


def _step_outlier(b: Build[StepOutlierParams]) -> RuleOutput:
    p = b.p
    if p.stddev not in contract.OUTLIER_STDDEVS:
        grid = ", ".join(f"{s:g}" for s in contract.OUTLIER_STDDEVS)
        b.warnings.append(
            f"{b.path('stddev')}: {p.stddev:g} is not among the factors the training API "
            f"counts by default ({grid}); pass this configuration to trainprof.start() "
            "(rules_config=) so it counts this factor too"
        )
    outliers = b.sel(contract.TRAINING_STEP_OUTLIERS_TOTAL, **_step_outlier_equal(b))
    return RuleOutput(
        (),
        (
            Alert(
                expr=f"{outliers} > {p.n_outliers}",
                units=Units(
                    "rank_mode",
                    "rank and mode",
                    "ranks and modes",
                    "rank {{ .Labels.rank }} {{ .Labels.mode }} steps on "
                    "{{ or .Labels.node .Labels.instance }}",
                    Population(contract.TRAINING_STEP_OUTLIERS_TOTAL, _step_outlier_equal(b)),
                    value_text="slow steps",
                ),
                # A count since the job started: it cannot fall back below the threshold,
                # so there is no noise to hold through (the alert ends with the job).
                hold=0,
                summary="Training steps are much slower than usual.",
                description=(
                    f"have had more than {p.n_outliers} steps slower than the mean plus "
                    f"{p.stddev:g} standard deviations of their earlier steps"
                ),
            ),
        ),
    )


def _step_outlier_equal(b: Build[StepOutlierParams]) -> dict[str, str]:
    equal = {"stddev": contract.threshold_label(b.p.stddev)}
    if b.p.mode:
        equal["mode"] = b.p.mode
    return equal


def _step_outlier_signals(
    b: Build[StepOutlierParams], out: RuleOutput, scope: Selects, _: Recordings
) -> tuple[Signal, ...]:
    p = b.p
    return (
        Signal(
            f"Steps slower than the mean + {p.stddev:g} standard deviations",
            scope.sel(contract.TRAINING_STEP_OUTLIERS_TOTAL, **_step_outlier_equal(b)),
            "rank {{rank}} {{mode}}",
            NUMBER_UNIT,
            Threshold(p.n_outliers, f"n_outliers = {p.n_outliers}", "above"),
        ),
    )


def _step_outlier_inputs(b: Build[StepOutlierParams]) -> dict[str, float]:
    return {"step_outlier_stddevs": float(b.p.stddev)}


STEP_OUTLIER = RuleSpec(
    name="StepOutlier",
    datapoints="steps",
    summary="Outliers in step duration",
    detects=(
        "Per rank and mode, steps slower than the mean plus `stddev` standard deviations of "
        "all earlier steps, once 100 steps exist. More than `n_outliers` such steps point "
        "to stalls: garbage collection, checkpointing, a slow data shard, a straggling peer."
    ),
    recommendation=(
        "Correlate the slow steps with the other rules and the dashboards: data-loading "
        "waits (CPUBottleneck, IOBottleneck), checkpoint or evaluation phases, memory "
        "pressure, or one slow rank holding up a collective."
    ),
    severity="warning",
    parameters=StepOutlierParams,
    build=_step_outlier,
    signals=_step_outlier_signals,
    # The training API counts outliers at the factors it was told of.
    inputs=_step_outlier_inputs,
    reads_exporter=False,
    family="framework",
    differences=(
        "The training process compares each step, as it ends, with the mean and standard "
        "deviation of all earlier steps of its rank and mode (Welford, O(1) per step); the "
        "original recomputed the threshold over all steps every minute and recounted every "
        "step against it, so a step could stop or start counting later. `mode` filters the "
        "modes counted (the documented meaning; the original code only ever added names). "
        "The AWS documentation page gives `stddev` a default of 5; the SDK and the code "
        "use 3."
    ),
)


def _percent_of_cores(value):
    result = number(value)
    if not 0 <= result <= 10_000:
        raise ValueError(f"{value!r} is not a percentage of the cores between 0 and 10000")
    return result


# Dataloader's thresholds are percentages of the node's cores: 200 means two workers a core.
CORES_PERCENT = Kind("percent", "%", _percent_of_cores, "a percentage of the node's CPU cores")


@dataclasses.dataclass(frozen=True)
class DataloaderParams:
    min_threshold: float = param(
        70, CORES_PERCENT, "Fewest data-loading workers, as a percentage of the node's cores."
    )
    max_threshold: float = param(
        200, CORES_PERCENT, "Most data-loading workers, as a percentage of the node's cores."
    )
    patience: int = param(
        10, COUNT, "Seconds the worker count must stay outside the range before the rule fires."
    )
    scan_interval_us: int = scan_interval_param()


def _workers_per_core(b: Build[DataloaderParams]) -> Recording:
    workers = b.sel(contract.TRAINING_DATALOADER_WORKERS)
    cores = b.sel(contract.CPU_CORES)
    keep = ", ".join(b.job_labels + ("node",))
    return Recording(
        "node",
        contract.TRAINING_DATALOADER_WORKERS,
        "per_core",
        f"sum by ({keep}) ({workers})\n/ on ({keep})\nmax by ({keep}) ({cores})",
    )


def _dataloader(b: Build[DataloaderParams]) -> RuleOutput:
    p = b.p
    if p.min_threshold > p.max_threshold:
        b.warnings.append(
            f"{b.path('min_threshold')}: {p.min_threshold:g} is above max_threshold "
            f"({p.max_threshold:g}): the rule fires whatever the worker count"
        )
    per_core = _workers_per_core(b)
    ratio_of = selector(per_core.record, ())
    low, high = p.min_threshold / 100, p.max_threshold / 100

    def nodes(worst: str) -> Units:
        return Units(
            "node",
            "node",
            "nodes",
            "{{ or .Labels.node .Labels.instance }}",
            Population(per_core.record),
            "{{ .Value | humanizePercentage }}",
            "workers per core",
            worst,
        )

    described = (
        "had their training ranks load data with {} worker processes than {:g}% of the node's cores"
    )
    return RuleOutput(
        (per_core,),
        (
            Alert(
                expr=f"{ratio_of} < {low:g}",
                units=nodes("lowest"),
                for_seconds=float(p.patience),
                summary="Too few data-loading workers for the node's cores.",
                description=described.format("fewer", p.min_threshold),
                labels={"reason": "too_few"},
            ),
            Alert(
                expr=f"{ratio_of} > {high:g}",
                units=nodes("highest"),
                for_seconds=float(p.patience),
                summary="More data-loading workers than the node's cores can run.",
                description=described.format("more", p.max_threshold),
                labels={"reason": "too_many"},
            ),
        ),
    )


def _dataloader_signals(
    b: Build[DataloaderParams], out: RuleOutput, scope: Selects, _: Recordings
) -> tuple[Signal, ...]:
    p = b.p
    expr = scope.sel(out.recordings[0].record)
    title = "Data-loading workers per core of the node"
    return (
        Signal(
            title,
            expr,
            "{{node}}",
            RATIO_UNIT,
            Threshold(p.min_threshold / 100, f"min_threshold = {p.min_threshold:g}%", "below"),
        ),
        Signal(
            title,
            expr,
            "{{node}}",
            RATIO_UNIT,
            Threshold(p.max_threshold / 100, f"max_threshold = {p.max_threshold:g}%", "above"),
        ),
    )


DATALOADER = RuleSpec(
    name="Dataloader",
    summary="Data-loading workers out of proportion to the cores",
    detects=(
        "Per node, the data-loading worker processes of its training ranks (each rank's "
        "DataLoader `num_workers`, as `trainprof.data(loader)` reads it) against the node's "
        "CPU cores. Fewer than `min_threshold` % of the cores leaves cores idle while the "
        "GPUs may wait for data; more than `max_threshold` % makes the workers compete for "
        "the cores."
    ),
    recommendation=(
        "Set the DataLoader's num_workers so that all ranks of a node together use about "
        "as many workers as the node has cores: raise it when the rule says too few, and "
        "lower it (or pin the workers) when it says too many."
    ),
    severity="warning",
    parameters=DataloaderParams,
    build=_dataloader,
    signals=_dataloader_signals,
    family="framework",
    datapoints="ranks",
    differences=(
        "The original counted the distinct process ids of PyTorch's DataLoader worker "
        "events in every second of the framework trace and compared their median over "
        "`scan_interval_us` with the cores; trainprof compares the workers the ranks "
        "configured (`num_workers`, summed over the ranks of a node) with the node's cores "
        "from the exporter, and `patience` is seconds outside the range (the original's "
        "per-second counts), as the alert's `for:`. Loaders that do not say how many "
        "workers they use (any iterable without `num_workers`) leave the rule without "
        "data, and so does replay of SageMaker output, whose traces replay does not count "
        "workers in."
    ),
)


def _overall_framework(b: Build[SummaryParams]) -> RuleOutput:
    phase = b.sel(contract.TRAINING_PHASE_SECONDS_TOTAL)
    duration = b.sel(contract.TRAINING_STEP_DURATION_SECONDS + "_sum")
    count = b.sel(contract.TRAINING_STEP_DURATION_SECONDS + "_count")
    start = b.sel(contract.TRAINING_START_TIMESTAMP_SECONDS)
    first = b.sel(contract.TRAINING_FIRST_STEP_TIMESTAMP_SECONDS)
    jl = ", ".join(b.job_labels)
    return RuleOutput(
        (
            Recording(
                "rank_phase",
                RECORDED_PHASE,
                "ratio",
                f"{phase}\n/ ignoring (phase) group_left\nsum without (phase) ({phase})",
            ),
            Recording(
                "training_job_phase",
                RECORDED_PHASE,
                "ratio",
                f"sum by ({jl}, phase) ({phase})\n/ ignoring (phase) group_left\n"
                f"sum {b.by_job} ({phase})",
            ),
            Recording(
                "training_job_mode",
                contract.TRAINING_STEP_DURATION_SECONDS,
                "ratio",
                f"sum by ({jl}, mode) ({duration})\n/ ignoring (mode) group_left\n"
                f"sum {b.by_job} ({duration})",
            ),
            Recording(
                "rank_mode",
                contract.TRAINING_STEP_DURATION_SECONDS,
                "mean",
                f"{duration}\n/\n{count}",
            ),
            Recording(
                JOB_LABEL,
                RECORDED_INITIALIZATION,
                "min",
                f"min {b.by_job} ({first})\n-\nmin {b.by_job} ({start})",
            ),
        ),
        (),
    )


OVERALL_FRAMEWORK_METRICS = RuleSpec(
    name="OverallFrameworkMetrics",
    datapoints="steps",
    summary="Where training time goes (no alert)",
    detects=(
        "Recording rules for the report and the dashboards: each phase's share of the "
        "training loop per rank and per job, each mode's share of step time, the mean step "
        "duration per rank and mode, and the time from start to the first step."
    ),
    recommendation=(
        "Use the phase breakdown to decide where to optimise first: a large dataloader "
        "share points at the input pipeline, a large optimizer or collective share at "
        "communication or optimizer settings."
    ),
    severity="info",
    parameters=SummaryParams,
    build=_overall_framework,
    reads_exporter=False,
    family="framework",
    alerting=False,
    differences=(
        "Phases come from the training API's timers (dataloader, forward, backward, "
        "optimizer, ...) rather than from profiler trace events, and shares are cumulative "
        "since the process started, like the original. There are no CPU/GPU operator or "
        "Horovod breakdowns."
    ),
)

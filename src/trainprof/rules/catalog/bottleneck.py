"""CPUBottleneck and IOBottleneck: starved GPUs while the host is saturated."""

from __future__ import annotations

from trainprof import metrics as contract
from trainprof.rules.catalog._text import JOB, PCT
from trainprof.rules.model import Alert, Build, Recording, RuleOutput, RuleSpec, ratio
from trainprof.rules.params import COUNT, PERCENT, SCAN_INTERVAL, Param, patience
from trainprof.rules.promql import selector

_WINDOW = Param(
    "window",
    None,
    COUNT,
    "Optional: count only the last `window` datapoints instead of everything since the job "
    "started (trainprof extension).",
    extension=True,
)


def _bottleneck(
    b: Build, *, counter: str, busy_label: str, busy_param: str, summary: str, busy_text: str
) -> RuleOutput:
    p = b.p
    busy_percent = getattr(p, busy_param)
    _warn_off_grid(b, busy_param, busy_percent, contract.BUSY_THRESHOLDS)
    _warn_off_grid(b, "gpu_threshold", p.gpu_threshold, contract.GPU_IDLE_THRESHOLDS)
    grid = {busy_label: ratio(busy_percent), "gpu_below": ratio(p.gpu_threshold)}
    hits = b.sel(counter, **grid)
    samples = b.sel("trainprof_samples_total")
    if p.window is None:
        num, den, op, since = hits, samples, "ratio", "since the job started"
    else:
        span = b.span(p.window, "window")
        num, den = f"increase({hits}[{span}])", f"increase({samples}[{span}])"
        op, since = f"ratio_increase{span}", f"over the last {span}"
    record = f"training_job:{counter.removesuffix('_total')}:{op}"
    keep = ", ".join(b.job_labels + (busy_label, "gpu_below"))
    recording = Recording(
        record,
        (
            f"sum by ({keep}) ({num})\n"
            f"/ ignoring ({busy_label}, gpu_below) group_left\n"
            f"sum {b.by_job} ({den})"
        ),
    )
    condition = f"{selector(record, **grid)} > {ratio(p.threshold)}"
    expr, for_seconds = b.patience(
        condition, p.patience, f"sum {b.by_job} ({samples})", matching=b.on_job
    )
    alert = Alert(
        expr=expr,
        for_seconds=for_seconds,
        summary=summary,
        description=(
            f"Job {JOB}: {PCT} of the samples {since} had {busy_text} above "
            f"{busy_percent:g}% while a GPU was below {p.gpu_threshold:g}% busy "
            f"(the rule fires above {p.threshold:g}%)."
        ),
    )
    return RuleOutput((recording,), (alert,))


def _warn_off_grid(b: Build, param: str, percent: float, grid: tuple[float, ...]) -> None:
    if percent / 100 not in grid:
        points = ", ".join(f"{g * 100:g}" for g in grid)
        b.warnings.append(
            f"{b.path(param)}: {percent:g} is not on the exporter's default threshold grid "
            f"({points}); start every exporter with --rules.config pointing at this "
            "configuration so it counts this threshold too (TrainprofRuleInputMissing fires "
            "until it does)"
        )


def _cpu(b: Build) -> RuleOutput:
    return _bottleneck(
        b,
        counter="trainprof_cpu_bottleneck_samples_total",
        busy_label="cpu_above",
        busy_param="cpu_threshold",
        summary="GPUs starve while a CPU core is saturated.",
        busy_text="a CPU core",
    )


def _io(b: Build) -> RuleOutput:
    return _bottleneck(
        b,
        counter="trainprof_io_bottleneck_samples_total",
        busy_label="iowait_above",
        busy_param="io_threshold",
        summary="GPUs starve while CPU cores wait on I/O.",
        busy_text="a CPU core's I/O wait",
    )


_SHARED_DIFFERENCES = (
    "A datapoint is one exporter sample (every `datapoint_interval`), counted by the exporter "
    "itself, so the ratio does not depend on the scrape interval. The original clustered "
    "events within 20 ms into snapshots and, across nodes, could pair a busy core of one node "
    "with an idle GPU of another when their timestamps coincided; trainprof only pairs a core "
    "and a GPU of the same host and sample. The ratio pools every node of the job, as the "
    "original did. Thresholds are compared as ratios (90 % -> 0.9). With `patience_mode: for` "
    "(the default for this rule) the ratio must stay above `threshold` for `patience` "
    "datapoints before the alert fires; `warmup` checks it as soon as `patience` datapoints "
    "exist, as SageMaker did. The original's verdict was sticky; this alert resolves when the "
    "ratio falls back below the threshold."
)

CPU_BOTTLENECK = RuleSpec(
    name="CPUBottleneck",
    summary="GPUs idle while a CPU core is saturated",
    detects=(
        "The share of samples in which at least one GPU is nearly idle (below "
        "`gpu_threshold`) while at least one CPU core is nearly saturated (above "
        "`cpu_threshold`), counted since the job started. Above `threshold` percent, the "
        "input pipeline on the CPU is likely what keeps the GPUs waiting."
    ),
    recommendation=(
        "Move work off the critical CPU path: use more DataLoader workers, pin memory and "
        "prefetch, pre-process the dataset once instead of every epoch, or move augmentation "
        "to the GPU. If the host is simply too small, pick an instance with more cores per "
        "GPU."
    ),
    severity="critical",
    params=(
        Param(
            "threshold",
            50,
            PERCENT,
            "Percent of all datapoints that must be bottlenecks for the rule to fire.",
        ),
        Param("gpu_threshold", 10, PERCENT, "A GPU below this utilization counts as idle."),
        Param("cpu_threshold", 90, PERCENT, "A core above this utilization counts as busy."),
        patience(),
        SCAN_INTERVAL,
        _WINDOW,
    ),
    build=_cpu,
    family="bottleneck",
    # Idle GPUs are the symptom of this bottleneck, not a second problem.
    inhibits=("LowGPUUtilization", "BatchSize"),
    differences=_SHARED_DIFFERENCES,
)

IO_BOTTLENECK = RuleSpec(
    name="IOBottleneck",
    summary="GPUs idle while CPU cores wait on I/O",
    detects=(
        "The share of samples in which at least one GPU is nearly idle (below "
        "`gpu_threshold`) while at least one CPU core spends more than `io_threshold` percent "
        "of its time in I/O wait, counted since the job started. Above `threshold` percent, "
        "storage or network reads are likely what keeps the GPUs waiting."
    ),
    recommendation=(
        "Read less or read sooner: prefetch and cache the dataset on local disk, use a "
        "sequential, sharded format (WebDataset, TFRecord, Parquet) instead of many small "
        "files, raise the DataLoader's prefetch_factor, and check the storage throughput "
        "limits of the volume."
    ),
    severity="critical",
    params=(
        Param(
            "threshold",
            50,
            PERCENT,
            "Percent of all datapoints that must be bottlenecks for the rule to fire.",
        ),
        Param("gpu_threshold", 10, PERCENT, "A GPU below this utilization counts as idle."),
        Param(
            "io_threshold",
            50,
            PERCENT,
            "A core with more I/O wait than this counts as waiting on I/O.",
        ),
        patience(),
        SCAN_INTERVAL,
        _WINDOW,
    ),
    build=_io,
    family="bottleneck",
    inhibits=("LowGPUUtilization", "BatchSize"),
    differences=_SHARED_DIFFERENCES
    + (
        " The AWS documentation page gives `gpu_threshold` a default of 70; the SDK and the "
        "rule code use 10, and so does trainprof."
    ),
)

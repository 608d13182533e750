"""CPUBottleneck and IOBottleneck: starved GPUs while the host is saturated."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, TypeVar

from trainprof.contract import metrics as contract
from trainprof.contract.durations import format_duration
from trainprof.contract.names import INPUT_MISSING_ALERT, JOB_LABEL
from trainprof.engines.promtool import SAFE_SCRAPES
from trainprof.rules.catalog._text import JOB, PCT
from trainprof.rules.model import (
    RATIO_UNIT,
    Alert,
    Build,
    HealthCheck,
    Recording,
    Recordings,
    RuleOutput,
    RuleSpec,
    Selects,
    Signal,
    percent_threshold,
    ratio,
)
from trainprof.rules.params import (
    COUNT,
    PERCENT,
    param,
    patience_param,
    scan_interval_param,
)
from trainprof.rules.promql import selector
from trainprof.sources.gauges import BUSIEST_CORE, GPU_GAUGES

# The busiest core as trainprof's exporter serves it (BUSIEST_CORE: as node_exporter's
# recordings give it).
EXPORTER_BUSIEST_CORE = {
    "cpu": contract.CPU_BUSIEST_CORE_UTILIZATION_RATIO,
    "iowait": contract.CPU_BUSIEST_CORE_IOWAIT_RATIO,
}


def _window_param() -> Any:
    return param(
        None,
        COUNT,
        "Optional: count only the last `window` datapoints instead of everything since the job "
        "started (trainprof extension).",
        extension=True,
    )


def _threshold_param() -> Any:
    return param(
        50, PERCENT, "Percent of all datapoints that must be bottlenecks for the rule to fire."
    )


def _gpu_threshold_param() -> Any:
    return param(10, PERCENT, "A GPU below this utilization counts as idle.")


@dataclasses.dataclass(frozen=True)
class CPUBottleneckParams:
    threshold: float = _threshold_param()
    gpu_threshold: float = _gpu_threshold_param()
    cpu_threshold: float = param(90, PERCENT, "A core above this utilization counts as busy.")
    patience: int = patience_param()
    scan_interval_us: int = scan_interval_param()
    window: int | None = _window_param()


@dataclasses.dataclass(frozen=True)
class IOBottleneckParams:
    threshold: float = _threshold_param()
    gpu_threshold: float = _gpu_threshold_param()
    io_threshold: float = param(
        50, PERCENT, "A core with more I/O wait than this counts as waiting on I/O."
    )
    patience: int = patience_param()
    scan_interval_us: int = scan_interval_param()
    window: int | None = _window_param()


class _Shared(Protocol):
    """What the two bottleneck rules' parameters have in common."""

    @property
    def threshold(self) -> float: ...
    @property
    def gpu_threshold(self) -> float: ...
    @property
    def patience(self) -> int: ...
    @property
    def window(self) -> int | None: ...


Bottleneck = TypeVar("Bottleneck", bound=_Shared)


def _bottleneck(
    b: Build[Bottleneck],
    *,
    counter: str,
    busy_label: str,
    busy_param: str,
    summary: str,
    busy_text: str,
) -> RuleOutput:
    p = b.p
    busy_percent = getattr(p, busy_param)
    grid = {busy_label: ratio(busy_percent), "gpu_below": ratio(p.gpu_threshold)}
    if _scraped(b):
        return _scraped_bottleneck(
            b, counter=counter, grid=grid, summary=summary, busy_text=busy_text
        )
    _warn_off_grid(b, busy_param, busy_percent, contract.BUSY_THRESHOLDS)
    _warn_off_grid(b, "gpu_threshold", p.gpu_threshold, contract.GPU_IDLE_THRESHOLDS)
    hits = b.sel(counter, **grid)
    samples = b.sel(contract.SAMPLES_TOTAL)
    if p.window is None:
        num, den, op, since = hits, samples, "ratio", "since the job started"
    else:
        span = b.span(p.window, "window")
        num, den = f"increase({hits}[{span}])", f"increase({samples}[{span}])"
        op, since = f"ratio_increase{span}", f"over the last {span}"
    keep = ", ".join(b.job_labels + (busy_label, "gpu_below"))
    recording = Recording(
        JOB_LABEL,
        counter.removesuffix("_total"),
        op,
        (
            f"sum by ({keep}) ({num})\n"
            f"/ ignoring ({busy_label}, gpu_below) group_left\n"
            f"sum {b.by_job} ({den})"
        ),
    )
    condition = f"{selector(recording.record, (), **grid)} > {ratio(p.threshold)}"
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


def _scraped(b: Build[Any]) -> bool:
    """Whether a source adapter serves the GPU or the host signal, so no exporter counts
    the joint samples."""
    return b.gpu_source != "trainprof" or b.host_source != "trainprof"


# How far back "since the job started" reaches when the samples are a source adapter's
# scrapes (no exporter counts them): at most 7 days and promtool's SAFE_SCRAPES (37.5 h at
# 15 s), so replay and the rule tests can evaluate it; Prometheus' own limit (50 M samples
# per query) then holds for thousands of jobs.
SINCE_START_DAYS = 7


def since_start(scrape_interval: float) -> str:
    """The range standing for "since the job started" at `scrape_interval`.

    >>> since_start(15), since_start(1)
    ('1d13h30m', '2h30m')
    """
    return format_duration(min(SINCE_START_DAYS * 86400, SAFE_SCRAPES * scrape_interval))


def _scraped_bottleneck(
    b: Build[Bottleneck], *, counter: str, grid: dict[str, str], summary: str, busy_text: str
) -> RuleOutput:
    """The bottleneck share when dcgm-exporter or node_exporter serves the GPU or host
    signal: each scrape of a node is one sample, a bottleneck when its busiest core is above
    the busy threshold while its least busy GPU of the job is below the idle one."""
    p = b.p
    busy_label = contract.metric(counter).labels[0]
    jl = ", ".join(b.job_labels)
    kind = "cpu" if busy_label == "cpu_above" else "iowait"
    if b.host_source == "node_exporter":
        busiest = selector(BUSIEST_CORE[kind], b.matchers)
    else:
        busiest = b.sel(EXPORTER_BUSIEST_CORE[kind])
    if b.gpu_source == "dcgm":
        gpus = selector(GPU_GAUGES[contract.GPU_UTILIZATION_SAMPLED_RATIO], b.matchers)
    else:
        gpus = b.sel(contract.GPU_UTILIZATION_RATIO)
    # Each node's least busy GPU of the job at each scrape: one recording both rules read.
    least = Recording(
        "node",
        contract.GPU_UTILIZATION_RATIO,
        "min",
        f"min by (node, {jl}) ({gpus})",
        every_scrape=True,
    )
    base = counter.removesuffix("_total")
    scraped = Recording(
        "node",
        base,
        "scraped",
        (
            f"(max by (node, {jl}) ({busiest}) > bool {grid[busy_label]})\n"
            f"* on (node, {jl})\n"
            f"({least.record} < bool {grid['gpu_below']})"
        ),
        grid,
        every_scrape=True,
    )
    # Each scrape's bottlenecked nodes and nodes of a job, per job: the ranges below then
    # read one series per job, not one per node.
    indicator = selector(scraped.record, (), **grid)
    keep = f"{jl}, {busy_label}, gpu_below"
    hits = Recording(
        JOB_LABEL, base, "scraped", f"sum by ({keep}) ({indicator})", grid, every_scrape=True
    )
    nodes = Recording(
        JOB_LABEL,
        base,
        "scraped_nodes",
        f"count by ({keep}) ({indicator})",
        grid,
        every_scrape=True,
    )
    if p.window is None:
        span, since = since_start(b.scrape_interval), "since the job started"
    else:
        span = b.span(p.window, "window")
        since = f"over the last {span}"
    hit_sel = selector(hits.record, b.matchers, **grid)
    node_sel = selector(nodes.record, b.matchers, **grid)
    recording = Recording(
        JOB_LABEL,
        base,
        f"ratio_over_time{span}",
        f"sum_over_time({hit_sel}[{span}])\n/\nsum_over_time({node_sel}[{span}])",
    )
    per_scrape = b.scrape_interval / b.datapoint_interval
    samples = f"sum {b.by_job} (sum_over_time({node_sel}[{span}])) * {per_scrape:g}"
    condition = f"{selector(recording.record, (), **grid)} > {ratio(p.threshold)}"
    expr, for_seconds = b.patience(condition, p.patience, samples, matching=b.on_job)
    alert = Alert(
        expr=expr,
        for_seconds=for_seconds,
        summary=summary,
        description=(
            f"Job {JOB}: {PCT} of the scrapes {since} had {busy_text} above "
            f"{float(grid[busy_label]) * 100:g}% while a GPU was below "
            f"{p.gpu_threshold:g}% busy (the rule fires above {p.threshold:g}%)."
        ),
    )
    return RuleOutput((least, scraped, hits, nodes, recording), (alert,))


def _warn_off_grid(
    b: Build[Bottleneck], param: str, percent: float, grid: tuple[float, ...]
) -> None:
    if percent / 100 not in grid:
        points = ", ".join(f"{g * 100:g}" for g in grid)
        b.warnings.append(
            f"{b.path(param)}: {percent:g} is not on the exporter's default threshold grid "
            f"({points}); start every exporter with --rules.config pointing at this "
            "configuration so it counts this threshold too (TrainprofRuleInputMissing fires "
            "until it does)"
        )


def _grid(b: Build[Bottleneck], counter: str, busy_param: str) -> dict[str, str]:
    """The counter's labels for the configured thresholds: {"cpu_above": "0.9", ...}."""
    busy_label, gpu_label = contract.metric(counter).labels
    return {
        busy_label: contract.threshold_label(getattr(b.p, busy_param) / 100),
        gpu_label: contract.threshold_label(b.p.gpu_threshold / 100),
    }


def _signals(counter: str, busy_param: str, busy_text: str):
    def signals(
        b: Build[Bottleneck], out: RuleOutput, scope: Selects, _: Recordings
    ) -> tuple[Signal, ...]:
        p = b.p
        return (
            Signal(
                f"Samples with {busy_text} above {getattr(p, busy_param):g}% while a GPU is "
                f"below {p.gpu_threshold:g}%",
                scope.sel(out.recordings[-1].record, **_grid(b, counter, busy_param)),
                "{{training_job}}",
                RATIO_UNIT,
                percent_threshold("threshold", p.threshold, "above"),
            ),
        )

    return signals


def _health(name: str, counter: str, busy_param: str):
    def health(b: Build[Bottleneck]) -> tuple[HealthCheck, ...]:
        """The exporters count samples only at the thresholds they were told of."""
        if _scraped(b):
            return ()  # counted from the adapters' scrapes, at any threshold
        jl = ", ".join(b.job_labels)
        busy_label = contract.metric(counter).labels[0]
        grid = _grid(b, counter, busy_param)
        served = b.sel(counter, **grid)
        samples = b.sel(contract.SAMPLES_TOTAL)
        return (
            HealthCheck(
                INPUT_MISSING_ALERT,
                f"count by ({jl}) ({samples})\nunless on ({jl})\ncount by ({jl}) ({served})",
                summary="Exporters do not serve a series a rule needs.",
                description=(
                    f"The exporters of job {{{{ $labels.training_job }}}} do not count "
                    f'{counter}{{{busy_label}="{grid[busy_label]}", gpu_below='
                    f'"{grid["gpu_below"]}"}}, so {name} cannot fire. Start them with '
                    "--rules.config set to the rule configuration."
                ),
            ),
        )

    return health


def _inputs(key: str, busy_param: str):
    def inputs(b: Build[Bottleneck]) -> dict[str, tuple[float, float]]:
        return {key: (getattr(b.p, busy_param) / 100, b.p.gpu_threshold / 100)}

    return inputs


_CPU_COUNTER = contract.CPU_BOTTLENECK_SAMPLES_TOTAL
_IO_COUNTER = contract.IO_BOTTLENECK_SAMPLES_TOTAL


def _cpu(b: Build[CPUBottleneckParams]) -> RuleOutput:
    return _bottleneck(
        b,
        counter=_CPU_COUNTER,
        busy_label="cpu_above",
        busy_param="cpu_threshold",
        summary="GPUs starve while a CPU core is saturated.",
        busy_text="a CPU core",
    )


def _io(b: Build[IOBottleneckParams]) -> RuleOutput:
    return _bottleneck(
        b,
        counter=_IO_COUNTER,
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
    "ratio falls back below the threshold. With `source: dcgm` or `node_exporter` no exporter "
    "counts joint samples: each scrape of a node is a datapoint (its busiest core from "
    "node_exporter's per-scrape rates, or trainprof's core gauges, against its least busy GPU "
    "from dcgm, or trainprof's GPU gauge), recorded every scrape in `trainprof.sources`, and "
    '"since the job started" reaches back at most 9,000 scrapes (37.5 hours at a 15 s '
    "scrape, 2.5 hours at 1 s; promtool's engine refuses ranges of more than 10,000 "
    "samples) and 7 days."
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
    parameters=CPUBottleneckParams,
    build=_cpu,
    signals=_signals(_CPU_COUNTER, "cpu_threshold", "a CPU core"),
    inputs=_inputs("cpu_bottleneck", "cpu_threshold"),
    health=_health("CPUBottleneck", _CPU_COUNTER, "cpu_threshold"),
    # SageMaker's definition of a starved GPU: the fleet dashboard's idle GPU-hours.
    gpu_idle_param="gpu_threshold",
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
    parameters=IOBottleneckParams,
    build=_io,
    signals=_signals(_IO_COUNTER, "io_threshold", "a core's I/O wait"),
    inputs=_inputs("io_bottleneck", "io_threshold"),
    health=_health("IOBottleneck", _IO_COUNTER, "io_threshold"),
    family="bottleneck",
    inhibits=("LowGPUUtilization", "BatchSize"),
    differences=_SHARED_DIFFERENCES
    + (
        " The AWS documentation page gives `gpu_threshold` a default of 70; the SDK and the "
        "rule code use 10, and so does trainprof."
    ),
)

"""GPU rules: LowGPUUtilization, BatchSize, GPUMemoryIncrease, LoadBalancing."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainprof.contract import metrics as contract
from trainprof.contract.durations import format_duration, parse_duration
from trainprof.rules.model import (
    NUMBER_UNIT,
    RATIO_UNIT,
    Alert,
    Build,
    Population,
    Recording,
    Recordings,
    RuleOutput,
    RuleSpec,
    Selects,
    Signal,
    Threshold,
    Units,
    indent,
    percent_threshold,
    ratio,
)
from trainprof.rules.params import (
    COUNT,
    DISTANCE,
    PERCENT,
    param,
    patience_param,
    scan_interval_param,
)

_UTIL = contract.GPU_UTILIZATION_SAMPLED_RATIO
_MEMORY = contract.GPU_MEMORY_USED_SAMPLED_RATIO
_CPU = contract.CPU_UTILIZATION_SAMPLED_RATIO


def _window_param(default: int, help: str) -> Any:
    return param(default, COUNT, help)


_PERCENTILES_WINDOW = "Datapoints the percentiles are computed over."


@dataclasses.dataclass(frozen=True)
class LowGPUUtilizationParams:
    threshold_p95: float = param(
        70, PERCENT, "A 95th percentile utilization below this means underuse."
    )
    threshold_p5: float = param(
        10, PERCENT, "A 5th percentile below this, with a high 95th percentile, means fluctuation."
    )
    window: int = _window_param(500, _PERCENTILES_WINDOW)
    patience: int = patience_param()
    scan_interval_us: int = scan_interval_param()


@dataclasses.dataclass(frozen=True)
class BatchSizeParams:
    cpu_threshold_p95: float = param(
        70, PERCENT, "Threshold for the 95th percentile of the host's average CPU utilization."
    )
    gpu_threshold_p95: float = param(
        70, PERCENT, "Threshold for the 95th percentile of GPU utilization."
    )
    gpu_memory_threshold_p95: float = param(
        70, PERCENT, "Threshold for the 95th percentile of GPU memory use."
    )
    patience: int = patience_param()
    window: int = _window_param(500, _PERCENTILES_WINDOW)
    scan_interval_us: int = scan_interval_param()


@dataclasses.dataclass(frozen=True)
class GPUMemoryIncreaseParams:
    increase: float = param(
        5, PERCENT, "Rise of the mean memory use, in percentage points, that fires the rule."
    )
    patience: int = patience_param()
    window: int = _window_param(10, "Datapoints each of the two compared means covers.")
    scan_interval_us: int = scan_interval_param()


@dataclasses.dataclass(frozen=True)
class LoadBalancingParams:
    threshold: float = param(
        0.5,
        DISTANCE,
        "Jensen-Shannon distance between two GPUs' utilization histograms that fires the rule.",
    )
    patience: int = patience_param()
    scan_interval_us: int = scan_interval_param()


@dataclasses.dataclass(frozen=True)
class QuantileTest:
    """Whether the q-quantile of every sample in a range lies below or above a threshold.

    When the threshold is a bucket bound, the test reads two series per histogram, the
    bucket at the threshold and the count: the q-quantile is below T exactly when more than
    a share q of the samples are at or below T (histogram_quantile would interpolate inside
    that same bucket). That is a tenth of the cost of `histogram_quantile` over all buckets,
    which matters for 8,000 GPUs. Off the bounds it falls back to `histogram_quantile`.
    """

    recording: Recording
    below: str  # PromQL condition: the quantile is below the threshold
    above: str  # ... above it
    measure: str  # what the value of a `below` condition is: "share of samples at or below 70%"
    worst: str  # highest | lowest: which values of a `below` condition are furthest below

    @classmethod
    def of(
        cls, b: Build[Any], level: str, histogram: str, q: float, percent: float, span: str
    ) -> QuantileTest:
        threshold = percent / 100
        gauge = b.gauge(histogram)
        if gauge is not None:
            # One sample per scrape from a source adapter: the exact quantile of those; a
            # sample on the threshold counts as below it, as with the bucket test.
            rec = Recording(
                level,
                histogram,
                f"p{q * 100:g}_over_time{span}",
                b.over_time(histogram, lambda s: f"quantile_over_time({q:g}, {s}[{span}])"),
            )
            return cls(
                rec,
                f"{rec.record} <= {ratio(percent)}",
                f"{rec.record} > {ratio(percent)}",
                f"{_ordinal(q)} percentile of the scraped values",
                "lowest",
            )
        if threshold in contract.UTILIZATION_BUCKETS and 0 < threshold < 1:
            share = b.sel(histogram + "_bucket", le=contract.bucket_label(threshold))
            count = b.sel(histogram + "_count")
            rec = Recording(
                level,
                histogram,
                f"fraction_below{percent:g}_rate{span}",
                f"sum without (le) (rate({share}[{span}]))\n/\nrate({count}[{span}])",
            )
            return cls(
                rec,
                f"{rec.record} > {q:g}",
                f"{rec.record} < {q:g}",
                f"share of samples at or below {percent:g}%",
                "highest",
            )
        buckets = b.sel(histogram + "_bucket")
        rec = Recording(
            level,
            histogram,
            f"p{q * 100:g}_rate{span}",
            f"histogram_quantile({q:g}, rate({buckets}[{span}]))",
        )
        return cls(
            rec,
            f"{rec.record} < {ratio(percent)}",
            f"{rec.record} > {ratio(percent)}",
            f"{_ordinal(q)} percentile",
            "lowest",
        )

    def gpus(self) -> Units:
        """The GPUs a `below` condition on this test finds, among those it measures."""
        return gpu_units(self.recording.record, self.measure, self.worst)


GPU_NAME = "{{ or .Labels.node .Labels.instance }} GPU {{ .Labels.gpu }}"


def gpu_units(population: str, measure: str, worst: str = "highest") -> Units:
    """GPUs, each named by its node and index, their value a percentage."""
    return Units(
        "gpu",
        "GPU",
        "GPUs",
        GPU_NAME,
        Population(population),
        "{{ .Value | humanizePercentage }}",
        measure,
        worst,
    )


def _ordinal(q: float) -> str:
    n = round(q * 100)
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _low_gpu(b: Build[LowGPUUtilizationParams]) -> RuleOutput:
    p = b.p
    span = b.span(p.window, "window")
    p95 = QuantileTest.of(b, "gpu", _UTIL, 0.95, p.threshold_p95, span)
    p5 = QuantileTest.of(b, "gpu", _UTIL, 0.05, p.threshold_p5, span)
    count = b.seen(_UTIL, p.patience)
    under, under_for = b.patience(p95.below, p.patience, count)
    fluct, fluct_for = b.patience(f"{p5.below}\nand\n{p95.above}", p.patience, count)
    return RuleOutput(
        (p95.recording, p5.recording),
        (
            Alert(
                per_gpu=True,
                units=p95.gpus(),
                expr=under,
                for_seconds=under_for,
                labels={"reason": "underutilized"},
                summary="GPUs are underutilized.",
                description=(
                    f"were underutilized over the last {span}: their 95th percentile "
                    f"utilization was below {p.threshold_p95:g}%"
                ),
            ),
            Alert(
                per_gpu=True,
                units=p5.gpus(),
                expr=fluct,
                for_seconds=fluct_for,
                labels={"reason": "fluctuating"},
                summary="GPUs alternate between busy and idle.",
                description=(
                    f"alternated between busy and idle over the last {span}: their 5th "
                    f"percentile utilization was below {p.threshold_p5:g}% while their 95th "
                    f"percentile was above {p.threshold_p95:g}%"
                ),
            ),
        ),
    )


_GPU_LEGEND = "{{node}} GPU {{gpu}}"


def _quantile(b: Build[Any], scope: Selects, histogram: str, q: float, span: str) -> str:
    """The q-quantile over `span` of the panel's selection, computed when the panel loads:
    the rules decide on the share of samples below the threshold (cheap at fleet scale),
    the dashboard shows the percentile itself for the few series on screen."""
    gauge = b.gauges.get(histogram)
    if gauge:
        return f"quantile_over_time({q:g}, {scope.sel(gauge)}[{span}])"
    return f"histogram_quantile({q:g}, rate({scope.sel(histogram + '_bucket')}[{span}]))"


def _low_gpu_signals(
    b: Build[LowGPUUtilizationParams], out: RuleOutput, scope: Selects, _: Recordings
) -> tuple[Signal, ...]:
    p = b.p
    span = b.span(p.window, "window")
    return (
        Signal(
            f"95th percentile GPU utilization over {span}",
            _quantile(b, scope, _UTIL, 0.95, span),
            _GPU_LEGEND,
            RATIO_UNIT,
            percent_threshold("threshold_p95", p.threshold_p95, "below"),
        ),
        Signal(
            f"5th percentile GPU utilization over {span}",
            _quantile(b, scope, _UTIL, 0.05, span),
            _GPU_LEGEND,
            RATIO_UNIT,
            percent_threshold("threshold_p5", p.threshold_p5, "below"),
        ),
    )


LOW_GPU_UTILIZATION = RuleSpec(
    name="LowGPUUtilization",
    summary="GPU underused or fluctuating",
    detects=(
        "Per GPU, the 95th and 5th percentiles of utilization over the last `window` "
        "datapoints. A 95th percentile below `threshold_p95` means the GPU is underused; a "
        "95th percentile above `threshold_p95` together with a 5th percentile below "
        "`threshold_p5` means it alternates between busy and idle, which usually points to "
        "stalls between steps."
    ),
    recommendation=(
        "If the GPU is underused, raise the batch size or move to a smaller or shared GPU. "
        "If it fluctuates, look for what the GPU waits on between steps: data loading (see "
        "CPUBottleneck and IOBottleneck), host-to-device copies, synchronisation between "
        "ranks, or logging and checkpointing inside the loop."
    ),
    severity="warning",
    parameters=LowGPUUtilizationParams,
    build=_low_gpu,
    signals=_low_gpu_signals,
    family="gpu",
    differences=(
        "Percentiles come from the exporter's utilization histogram (buckets of 1, 2, then "
        "5 %) over the range `window x datapoint_interval`, so they include every sample of "
        "the range at any scrape interval. A threshold on a bucket bound (SageMaker's 70 "
        "and 10 are) is decided by the share of samples at or below it (the 95th percentile "
        "is below 70 % when more than 95 % of the samples are at or below 70 %), which reads "
        "two series per GPU instead of the whole histogram; that matches the exact "
        "percentile except for samples lying exactly on the threshold, which count as below "
        "it. Other thresholds compare `histogram_quantile`, interpolated within a bucket. "
        "The two cases are one alert with a `reason` "
        "label (`underutilized`, `fluctuating`). The original's verdict was sticky; this "
        "alert resolves when the GPU recovers. With `source: dcgm` the percentiles are "
        "`quantile_over_time` of dcgm-exporter's scraped values (one per scrape, each the "
        "value dcgm collected last), a value on the threshold counting as below it."
    ),
)


def _batch_size(b: Build[BatchSizeParams]) -> RuleOutput:
    p = b.p
    span = b.span(p.window, "window")
    gpu = QuantileTest.of(b, "gpu", _UTIL, 0.95, p.gpu_threshold_p95, span)
    memory = QuantileTest.of(b, "gpu", _MEMORY, 0.95, p.gpu_memory_threshold_p95, span)
    cpu = QuantileTest.of(b, "node", _CPU, 0.95, p.cpu_threshold_p95, span)
    # The GPU and the host series match on everything but the GPU's labels when one
    # exporter serves both; series of two exporters share only the node and the job.
    if (b.gpu_source == "trainprof") == (b.host_source == "trainprof"):
        matching = "ignoring (gpu, uuid)"
    else:
        matching = f"on (node, {', '.join(b.job_labels)})"
    condition = f"{gpu.below}\nand\n{memory.below}\nand {matching}\n{cpu.below}"
    expr, for_seconds = b.patience(
        condition,
        max(p.patience, p.window),
        b.seen(_CPU, max(p.patience, p.window)),
        matching=matching,
    )
    return RuleOutput(
        (gpu.recording, memory.recording, cpu.recording),
        (
            Alert(
                per_gpu=True,
                units=gpu_units(gpu.recording.record, f"utilization: {gpu.measure}", gpu.worst),
                expr=expr,
                for_seconds=for_seconds,
                summary="The batch size is probably too small.",
                description=(
                    f"had room for more work per step over the last {span}: the 95th "
                    f"percentiles of their utilization, of their memory and of their host's "
                    f"CPU utilization were below {p.gpu_threshold_p95:g}%, "
                    f"{p.gpu_memory_threshold_p95:g}% and {p.cpu_threshold_p95:g}%"
                ),
            ),
        ),
    )


def _batch_size_signals(
    b: Build[BatchSizeParams], out: RuleOutput, scope: Selects, _: Recordings
) -> tuple[Signal, ...]:
    p = b.p
    span = b.span(p.window, "window")
    return tuple(
        Signal(
            f"95th percentile {what} over {span}",
            _quantile(b, scope, metric, 0.95, span),
            legend,
            RATIO_UNIT,
            percent_threshold(param, getattr(p, param), "below"),
        )
        for what, metric, param, legend in (
            ("GPU utilization", _UTIL, "gpu_threshold_p95", _GPU_LEGEND),
            ("GPU memory", _MEMORY, "gpu_memory_threshold_p95", _GPU_LEGEND),
            ("CPU utilization (average of the cores)", _CPU, "cpu_threshold_p95", "{{node}}"),
        )
    )


BATCH_SIZE = RuleSpec(
    name="BatchSize",
    summary="GPU, GPU memory and CPU all lightly used",
    detects=(
        "Per GPU, the 95th percentiles over the last `window` datapoints of GPU utilization, "
        "GPU memory use and the host's average CPU utilization. When all three stay below "
        "their thresholds, the job leaves most of the machine idle, which a larger batch "
        "would use."
    ),
    recommendation=(
        "Raise the batch size (scale the learning rate with it), or run on a smaller "
        "instance. This advice does not apply to frameworks that reserve most GPU memory "
        "up front."
    ),
    severity="info",
    parameters=BatchSizeParams,
    build=_batch_size,
    signals=_batch_size_signals,
    family="gpu",
    differences=(
        "Percentiles come from the exporter's histograms over `window x datapoint_interval` "
        "(see LowGPUUtilization). The CPU series is the average over the host's cores per "
        "sample, as in the original. The original skipped a node until it had more than "
        "`window` and `patience` CPU datapoints; the warm-up guard and `for:` use the larger "
        "of the two. The AWS documentation page gives `patience` a default of 100; the SDK "
        "and the rule code use 1000. With `source: dcgm` or `node_exporter` each signal "
        "from an adapter is the percentile of its scraped values (see LowGPUUtilization)."
    ),
)


def _memory_increase(b: Build[GPUMemoryIncreaseParams]) -> RuleOutput:
    p = b.p
    span = b.span(p.window, "window")
    # The earlier window ends one scrape interval before the later one starts: a jump falls
    # between two scrapes, so at some evaluation step it lies in that gap and both windows
    # hold only samples from one side of it; without the gap a window split by the jump
    # would hide up to half of it.
    gap = format_duration(parse_duration(span) + b.scrape_interval)
    mean, before, operation = _memory_means(b, b, span, gap)
    mean_record = Recording("gpu", _MEMORY, operation, mean)
    if b.gauges.get(_MEMORY):
        # The difference of two means scales with the samples: one join, not two.
        later, earlier = f"avg_over_time({{}}[{span}])", f"avg_over_time({{}}[{span}] offset {gap})"
        difference = b.over_time(_MEMORY, lambda s: f"{later.format(s)} - {earlier.format(s)}")
    else:
        difference = f"{mean}\n-\n{before}"
    rise, for_seconds = b.patience(difference, p.patience, b.seen(_MEMORY, p.patience))
    # Evaluated once per scan interval, but a jump shows for about one window only: look
    # back over the whole scan interval at scrape resolution so none is missed.
    scan = format_duration(p.scan_interval_us / 1e6)
    step = format_duration(b.scrape_interval)
    expr = f"max_over_time((\n{indent(rise)}\n)[{scan}:{step}])\n> {ratio(p.increase)}"
    return RuleOutput(
        (mean_record,),
        (
            Alert(
                per_gpu=True,
                units=gpu_units(mean_record.record, "rise, of the GPU's memory"),
                expr=expr,
                for_seconds=for_seconds,
                summary="GPU memory use grew sharply.",
                description=(
                    f"saw their mean memory use over {span} rise by more than "
                    f"{p.increase:g}% of their memory compared with the {span} before"
                ),
            ),
        ),
    )


def _memory_means(
    b: Build[Any], scope: Selects | Build[Any], span: str, gap: str
) -> tuple[str, str, str]:
    """The mean GPU memory use over the last `span` and over the `span` ending `gap` ago,
    and the recording operation naming the first: from the histogram's `_sum`/`_count`
    (every sample), or a source adapter's scraped gauge."""
    gauge = b.gauges.get(_MEMORY)
    if gauge and scope is b:
        # A rule: on the source's own samples (Build.over_time).
        return (
            b.over_time(_MEMORY, lambda s: f"avg_over_time({s}[{span}])"),
            b.over_time(_MEMORY, lambda s: f"avg_over_time({s}[{span}] offset {gap})"),
            f"mean_over_time{span}",
        )
    if gauge:
        g = scope.sel(gauge)
        return (
            f"avg_over_time({g}[{span}])",
            f"avg_over_time({g}[{span}] offset {gap})",
            f"mean_over_time{span}",
        )
    total, count = scope.sel(_MEMORY + "_sum"), scope.sel(_MEMORY + "_count")
    return (
        f"rate({total}[{span}]) / rate({count}[{span}])",
        f"rate({total}[{span}] offset {gap}) / rate({count}[{span}] offset {gap})",
        f"mean_rate{span}",
    )


def _memory_increase_signals(
    b: Build[GPUMemoryIncreaseParams], out: RuleOutput, scope: Selects, _: Recordings
) -> tuple[Signal, ...]:
    p = b.p
    span = b.span(p.window, "window")
    mean, before = _memory_means(b, scope, span, span)[:2]
    return (
        Signal(
            f"Mean GPU memory over the last {span} minus the mean over the {span} before",
            f"{mean}\n-\n{before}",
            _GPU_LEGEND,
            RATIO_UNIT,
            percent_threshold("increase", p.increase, "above"),
        ),
    )


GPU_MEMORY_INCREASE = RuleSpec(
    name="GPUMemoryIncrease",
    summary="GPU memory use jumped",
    detects=(
        "Per GPU, the mean memory use over the last `window` datapoints compared with the "
        "mean over the `window` datapoints before them. A rise of more than `increase` "
        "percentage points of the GPU's memory is a jump that often precedes an "
        "out-of-memory error: a leak, a growing cache, or an input larger than usual."
    ),
    recommendation=(
        "Look for tensors kept alive across steps (accumulated losses or outputs that still "
        "hold the graph), growing caches, and unusually large batches or sequences; "
        "torch.cuda.memory_summary() and the memory snapshot tool show who holds the "
        "memory. If growth is expected, raise `increase` or give the job a larger GPU."
    ),
    severity="warning",
    parameters=GPUMemoryIncreaseParams,
    build=_memory_increase,
    signals=_memory_increase_signals,
    family="gpu",
    patience_auto="warmup",
    differences=(
        "SageMaker's code compared the mean of the last `window` samples with the mean of a "
        "slice shifted by only one or two samples (an off-by-one), so it needed a jump of "
        "about five times `increase` to fire. trainprof implements the documented intent: "
        "the mean of the last window against the mean of the window before it (ending one "
        "scrape interval earlier, so a jump between two scrapes is seen whole). Both means "
        "come from the exporter's histogram `_sum`/`_count`, so they hold every sample. A "
        "window shorter than two scrape intervals (the default 10 datapoints = 5 s) is "
        "raised to two scrape intervals, and each evaluation looks back over the whole scan "
        "interval, so a jump between evaluations is not missed; samples taken before "
        "`patience` datapoints existed never count. `patience` is a warm-up guard here "
        "even in `patience_mode: auto`: the windowed increase lasts only about "
        "one window, so a patience-long `for:` could never be met. The AWS documentation "
        "page gives `increase` 10, `patience` 100 and `window` 500; the SDK and the rule "
        "code use 5, 1000 and 10. With `source: dcgm` the means are `avg_over_time` of "
        "dcgm-exporter's scraped framebuffer use over the same ranges."
    ),
)


def _load_balancing(b: Build[LoadBalancingParams]) -> RuleOutput:
    p = b.p
    if p.threshold > 0.8326:
        b.warnings.append(
            f"{b.path('threshold')}: {p.threshold:g} is above the largest possible "
            "Jensen-Shannon distance (0.8326); LoadBalancing can never fire"
        )
    distance = b.sel(contract.GPU_UTILIZATION_JS_DISTANCE)
    expr, for_seconds = b.patience(
        f"{distance} > {p.threshold:g}",
        p.patience,
        b.sel(_UTIL + "_count"),
        matching="ignoring (peer_gpu, peer_uuid)",
    )
    return RuleOutput(
        (),
        (
            Alert(
                per_gpu=True,
                units=Units(
                    "gpu_pair",
                    "pair of GPUs",
                    "pairs of GPUs",
                    "{{ or .Labels.node .Labels.instance }} GPUs {{ .Labels.gpu }} and "
                    "{{ .Labels.peer_gpu }}",
                    Population(contract.GPU_UTILIZATION_JS_DISTANCE),
                    '{{ .Value | printf "%.2f" }}',
                    "Jensen-Shannon distance",
                ),
                expr=expr,
                for_seconds=for_seconds,
                summary="GPUs of one host carry unequal load.",
                description=(
                    "on one host had utilization distributions more than "
                    f"{p.threshold:g} apart (Jensen-Shannon distance)"
                ),
            ),
        ),
    )


def _load_balancing_signals(
    b: Build[LoadBalancingParams], out: RuleOutput, scope: Selects, _: Recordings
) -> tuple[Signal, ...]:
    p = b.p
    return (
        Signal(
            "Jensen-Shannon distance between the utilization of two GPUs",
            scope.sel(contract.GPU_UTILIZATION_JS_DISTANCE),
            "{{node}} GPU {{gpu}} vs {{peer_gpu}}",
            NUMBER_UNIT,
            Threshold(p.threshold, f"threshold = {p.threshold:g}", "above"),
        ),
    )


LOAD_BALANCING = RuleSpec(
    name="LoadBalancing",
    min_gpus_per_node=2,
    # The distance between two GPUs' whole utilization distributions needs every 0.5 s
    # sample: dcgm-exporter's one value per scrape cannot make those histograms.
    gpu_sources=("trainprof",),
    summary="GPUs of a host carry unequal load",
    detects=(
        "For every pair of GPUs on a host, the Jensen-Shannon distance between their "
        "utilization distributions (2 % bins, every sample since the job started). A "
        "distance above `threshold` means the GPUs do different amounts of work."
    ),
    recommendation=(
        "Check how work is split: uneven data shards or sequence lengths, a rank that also "
        "does evaluation, logging or checkpointing, a model-parallel split with unequal "
        "stages, or a parameter server on one GPU. Balance the shards or move the extra "
        "work off the training ranks."
    ),
    severity="warning",
    parameters=LoadBalancingParams,
    build=_load_balancing,
    signals=_load_balancing_signals,
    family="gpu",
    differences=(
        "SageMaker's public code never compared two GPUs (a mis-indented loop), so the "
        "original never fired; trainprof implements the documented intent. The exporter "
        "computes the distance for every pair of GPUs on its host, in 2 % bins over [0, "
        "100] % (the original dropped samples above 98 %, so a GPU pinned at 100 % had no "
        "histogram at all). Pairs of GPUs on different hosts are not compared. The default "
        "threshold is the SDK's 0.5 (the rule code said 0.2); the AWS documentation page "
        "gives `patience` a default of 10, the SDK and code 1000. Not available with "
        "`source: dcgm`: one scraped value per interval cannot make the distributions, so "
        "the compiler leaves the rule out and says so."
    ),
)

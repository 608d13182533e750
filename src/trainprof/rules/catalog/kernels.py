"""Rules beyond SageMaker, over the kernel profile windows (`trainprof_kernel_*`, from
`trainprof.start(kernel_profile=...)`): what the SageMaker Profiler UI left to the eye.

LaunchBoundSteps, MemcpyHeavySteps and NoReducedPrecision judge each rank over `window`
minutes, which must hold at least one profiled window (by default 20 steps every 10 minutes):
an alert holds for about `window` minutes after the window that showed the condition, and a
rank without windows in that range is not judged (its ratios are 0/0, no sample).
"""

from __future__ import annotations

import dataclasses

from trainprof.contract import metrics as contract
from trainprof.contract.durations import format_duration
from trainprof.rules.catalog._text import RANK_NAME
from trainprof.rules.model import (
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
    Threshold,
    Units,
    percent_threshold,
    ratio,
)
from trainprof.rules.params import KERNEL_MICROS, MINUTES, PERCENT, param, scan_interval_param
from trainprof.rules.promql import Matcher, by, selector


def _ranks(population: Recording, measure: str) -> Units:
    """Profiled ranks, their value a share."""
    return Units(
        "rank",
        "rank",
        "ranks",
        RANK_NAME,
        Population(population.record),
        "{{ .Value | humanizePercentage }}",
        measure,
    )


def _window_param(default: float = 30) -> float:
    return param(
        default,
        MINUTES,
        "Minutes of profiled windows each verdict covers; at least the kernel profile's "
        "`every` so a window falls inside.",
        extension=True,
    )


def _minutes(window: float) -> str:
    """A window of minutes as a Prometheus duration, also valid in a record name:
    30 -> 30m, 1.5 -> 1m30s (a fraction such as 1.5m is neither)."""
    return format_duration(window * 60)


def _by_rank(b: Build) -> str:
    return by(tuple(b.job_labels) + ("node", "rank"))


def _increase(b: Build, metric: str, window: float, **equal: str) -> str:
    return f"sum {_by_rank(b)} (increase({b.sel(metric, **equal)}[{_minutes(window)}]))"


def _share(b: Build, part: str, whole: str, metric: str, operation: str) -> Recording:
    return Recording("rank", metric, operation, f"{part}\n/\n{whole}")


# --- LaunchBoundSteps ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LaunchBoundStepsParams:
    threshold: float = param(
        50,
        PERCENT,
        "Share of each profiled step's GPU window with nothing running above which the "
        "rank is launch-bound.",
        extension=True,
    )
    max_mean_kernel_us: float = param(
        20,
        KERNEL_MICROS,
        "Mean GPU event duration (kernels, memcpy, memset) below which kernels count as short.",
        extension=True,
    )
    window: float = _window_param()
    scan_interval_us: int = scan_interval_param()


def _launch_bound(b: Build[LaunchBoundStepsParams]) -> RuleOutput:
    p = b.p
    w = p.window
    idle = _share(
        b,
        _increase(b, contract.KERNEL_STEP_IDLE_SECONDS_TOTAL, w),
        _increase(b, contract.KERNEL_STEP_WINDOW_SECONDS_TOTAL, w),
        contract.KERNEL_STEP_IDLE_SECONDS_TOTAL,
        f"ratio_{_minutes(w)}",
    )
    mean = _share(
        b,
        _increase(b, contract.KERNEL_SECONDS_TOTAL, w),
        _increase(b, contract.KERNEL_LAUNCHES_TOTAL, w),
        contract.KERNEL_SECONDS_TOTAL,
        f"mean_per_launch_{_minutes(w)}",
    )
    alert = Alert(
        expr=(
            f"{idle.record} > {ratio(p.threshold)}\n"
            f"and on ({', '.join(tuple(b.job_labels) + ('node', 'rank'))})\n"
            f"{mean.record} < {p.max_mean_kernel_us * 1e-6:g}"
        ),
        units=_ranks(idle, "idle share of the steps' GPU window"),
        summary="Steps are launch-bound: many short kernels, the GPU idle between them.",
        description=(
            f"left their GPU idle for more than {p.threshold:g}% of each profiled step's GPU "
            f"window while their kernels averaged under {p.max_mean_kernel_us:g} us"
        ),
    )
    return RuleOutput((idle, mean), (alert,))


def _launch_bound_signals(
    b: Build[LaunchBoundStepsParams], out: RuleOutput, scope: Selects, _: Recordings
) -> tuple[Signal, ...]:
    p = b.p
    idle, mean = out.recordings
    return (
        Signal(
            f"GPU idle inside profiled steps over {p.window:g}m",
            scope.sel(idle.record),
            "rank {{rank}}",
            RATIO_UNIT,
            percent_threshold("threshold", p.threshold, "above"),
        ),
        Signal(
            f"Mean GPU event duration over {p.window:g}m",
            scope.sel(mean.record),
            "rank {{rank}}",
            SECONDS_UNIT,
            Threshold(
                p.max_mean_kernel_us * 1e-6,
                f"max_mean_kernel_us = {p.max_mean_kernel_us:g}",
                "below",
            ),
        ),
    )


LAUNCH_BOUND_STEPS = RuleSpec(
    name="LaunchBoundSteps",
    summary="Many short kernels with the GPU idle between them",
    detects="Per rank, over `window` minutes of profiled steps: the GPU idle for more than "
    "`threshold` percent of each step's GPU window (first to last event the step launched) "
    "while kernels, memcpy and memset average under `max_mean_kernel_us`.",
    recommendation="The CPU cannot launch kernels as fast as the GPU runs them. Capture the "
    "step with CUDA graphs (torch.compile mode='reduce-overhead'), fuse small operations "
    "(torch.compile, fused optimizers such as foreach/fused Adam), or raise the batch size so "
    "each kernel does more work.",
    severity="warning",
    parameters=LaunchBoundStepsParams,
    build=_launch_bound,
    signals=_launch_bound_signals,
    family="gpu",
    reads_exporter=False,
    differences="Not a SageMaker rule: the Profiler UI showed the kernel timeline and left "
    "this to the eye.",
)


# --- MemcpyHeavySteps ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class MemcpyHeavyStepsParams:
    threshold: float = param(
        30,
        PERCENT,
        "Share of the GPU's busy time spent in host-device copies (HtoD and DtoH) above "
        "which the rule fires.",
        extension=True,
    )
    pageable_threshold: float = param(
        10,
        PERCENT,
        "Share of the GPU's busy time in copies through pageable (unpinned) host memory "
        "above which the rule fires too.",
        extension=True,
    )
    window: float = _window_param()
    scan_interval_us: int = scan_interval_param()


def _host_copies(b: Build) -> str:
    metric = contract.KERNEL_ACTIVITY_SECONDS_TOTAL
    b.sel(metric)  # a KeyError if the contract lost it
    return selector(metric, (*b.matchers, Matcher("activity", "=~", "memcpy_htod|memcpy_dtoh")))


def _memcpy_heavy(b: Build[MemcpyHeavyStepsParams]) -> RuleOutput:
    p = b.p
    w = p.window
    busy = (
        f"(\n{_increase(b, 'trainprof_kernel_span_seconds_total', w)}\n-\n"
        f"{_increase(b, 'trainprof_kernel_gpu_idle_seconds_total', w)}\n)"
    )
    copies = _share(
        b,
        # a rank with no host copies at all has no such series: 0, not no verdict
        f"(\nsum {_by_rank(b)} (increase({_host_copies(b)}[{_minutes(w)}]))\nor\n0 * {busy}\n)",
        busy,
        contract.KERNEL_ACTIVITY_SECONDS_TOTAL,
        f"host_copy_share_{_minutes(w)}",
    )
    pageable = _share(
        b,
        _increase(b, contract.KERNEL_MEMCPY_PAGEABLE_SECONDS_TOTAL, w),
        busy,
        contract.KERNEL_MEMCPY_PAGEABLE_SECONDS_TOTAL,
        f"busy_share_{_minutes(w)}",
    )
    on = f"or on ({', '.join(tuple(b.job_labels) + ('node', 'rank'))})"
    alert = Alert(
        expr=f"{copies.record} > {ratio(p.threshold)}\n{on}\n"
        f"{pageable.record} > {ratio(p.pageable_threshold)}",
        units=_ranks(copies, "host copies' share of the busy time"),
        summary="Host-device memory copies take a large share of the GPU's time.",
        description=(
            f"spent more than {p.threshold:g}% of their GPU's busy time in the profiled steps "
            f"on host-device copies (or more than {p.pageable_threshold:g}% on copies from "
            "pageable host memory)"
        ),
    )
    return RuleOutput((copies, pageable), (alert,))


def _memcpy_heavy_signals(
    b: Build[MemcpyHeavyStepsParams], out: RuleOutput, scope: Selects, _: Recordings
) -> tuple[Signal, ...]:
    p = b.p
    copies, pageable = out.recordings
    return (
        Signal(
            f"Host-device copies, share of GPU busy time over {p.window:g}m",
            scope.sel(copies.record),
            "rank {{rank}}",
            RATIO_UNIT,
            percent_threshold("threshold", p.threshold, "above"),
        ),
        Signal(
            f"Pageable copies, share of GPU busy time over {p.window:g}m",
            scope.sel(pageable.record),
            "rank {{rank}}",
            RATIO_UNIT,
            percent_threshold("pageable_threshold", p.pageable_threshold, "above"),
        ),
    )


MEMCPY_HEAVY_STEPS = RuleSpec(
    name="MemcpyHeavySteps",
    summary="Host-device copies a large share of GPU time",
    detects="Per rank, over `window` minutes of profiled steps: host-to-device and "
    "device-to-host copies above `threshold` percent of the GPU's busy time, or copies "
    "through pageable host memory above `pageable_threshold` percent.",
    recommendation="Keep data on the GPU between steps; load batches with pin_memory=True "
    "and copy them with .to(device, non_blocking=True) so copies overlap compute; avoid "
    ".item(), .cpu() and printing tensors inside the step.",
    severity="warning",
    parameters=MemcpyHeavyStepsParams,
    build=_memcpy_heavy,
    signals=_memcpy_heavy_signals,
    family="gpu",
    reads_exporter=False,
    differences="Not a SageMaker rule: the Profiler UI drew the memory operations "
    "distribution and left this to the eye.",
)


# --- NoReducedPrecision --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class NoReducedPrecisionParams:
    threshold: float = param(
        80,
        PERCENT,
        "Share of GEMM and convolution kernel time in plain FP32 (not TF32, FP16, BF16, "
        "FP8, INT8) above which the rule fires.",
        extension=True,
    )
    min_matmul_share: float = param(
        20,
        PERCENT,
        "Share of all kernel time in GEMM and convolution kernels below which the rule "
        "stays quiet (little to gain).",
        extension=True,
    )
    window: float = _window_param()
    scan_interval_us: int = scan_interval_param()


def _no_reduced_precision(b: Build[NoReducedPrecisionParams]) -> RuleOutput:
    p = b.p
    w = p.window
    metric = contract.KERNEL_PRECISION_SECONDS_TOTAL
    matmul = _increase(b, metric, w, kernel_class="matmul")
    fp32 = _share(
        b,
        _increase(b, metric, w, kernel_class="matmul", precision="fp32"),
        matmul,
        metric,
        f"matmul_fp32_share_{_minutes(w)}",
    )
    matmul_share = _share(b, matmul, _increase(b, metric, w), metric, f"matmul_share_{_minutes(w)}")
    on = f"on ({', '.join(tuple(b.job_labels) + ('node', 'rank'))})"
    tensor_cores = f"max {_by_rank(b)} ({b.sel('trainprof_kernel_gpu_info', tensor_cores='true')})"
    alert = Alert(
        expr=(
            f"{fp32.record} > {ratio(p.threshold)}\n"
            f"and {on}\n{matmul_share.record} > {ratio(p.min_matmul_share)}\n"
            f"and {on}\n{tensor_cores}"
        ),
        units=_ranks(fp32, "FP32 share of the matrix time"),
        summary="Matrix multiplications run in FP32 on a GPU with tensor cores.",
        description=(
            f"ran more than {p.threshold:g}% of their GEMM and convolution time in plain FP32 "
            "on a GPU with tensor cores"
        ),
    )
    return RuleOutput((fp32, matmul_share), (alert,))


def _no_reduced_precision_signals(
    b: Build[NoReducedPrecisionParams], out: RuleOutput, scope: Selects, _: Recordings
) -> tuple[Signal, ...]:
    p = b.p
    fp32, matmul_share = out.recordings
    return (
        Signal(
            f"FP32 share of GEMM/convolution time over {p.window:g}m",
            scope.sel(fp32.record),
            "rank {{rank}}",
            RATIO_UNIT,
            percent_threshold("threshold", p.threshold, "above"),
        ),
        Signal(
            f"GEMM/convolution share of kernel time over {p.window:g}m",
            scope.sel(matmul_share.record),
            "rank {{rank}}",
            RATIO_UNIT,
            percent_threshold("min_matmul_share", p.min_matmul_share, "above"),
        ),
    )


NO_REDUCED_PRECISION = RuleSpec(
    name="NoReducedPrecision",
    summary="FP32 GEMMs dominate on a GPU with tensor cores",
    detects="Per rank, over `window` minutes of profiled steps, on a GPU with tensor cores "
    "(NVIDIA compute capability 7.0+, AMD Instinct): GEMM and convolution kernels are more "
    "than `min_matmul_share` percent of kernel time and more than `threshold` percent of "
    "them run in plain FP32 (precision read from kernel names, see trainprof.trace.classify).",
    recommendation="Train with automatic mixed precision (torch.autocast with bfloat16 or "
    "float16), or at least allow TF32 matmuls (torch.backends.cuda.matmul.allow_tf32 = True, "
    "torch.set_float32_matmul_precision('high')).",
    severity="info",
    parameters=NoReducedPrecisionParams,
    build=_no_reduced_precision,
    signals=_no_reduced_precision_signals,
    family="gpu",
    reads_exporter=False,
    differences="Not a SageMaker rule: the Profiler UI drew the kernel precision "
    "distribution and left this to the eye.",
)

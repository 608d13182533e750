"""The job dashboard's "GPU kernels" row: SageMaker Profiler's kernel-level panels from the
live kernel profile series (`trainprof.start(kernel_profile=...)`, `trainprof_kernel_*`).

Every number is over the dashboard's range and covers the profiled windows only (by default
20 steps every 10 minutes), so shares are the meaningful figures, not totals.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainprof.contract import metrics as contract
from trainprof.dashboards import panels as ui
from trainprof.dashboards.panels import target
from trainprof.dashboards.queries import RANGE, Scope

TOP = 15


def increase_by(scope: Scope, metric: str, by: str, over: str = RANGE) -> str:
    return f"sum by ({by}) (increase({scope.sel(metric)}[{over}]))"


def top_by(scope: Scope, metric: str, by: str, k: int = TOP, over: str = RANGE) -> str:
    return f"topk({k}, {increase_by(scope, metric, by, over)})"


def ratio_per_rank(scope: Scope, part: str, whole: str, over: str = RANGE) -> str:
    return f"{increase_by(scope, part, 'rank', over)}\n/\n{increase_by(scope, whole, 'rank', over)}"


def active_share(scope: Scope, over: str = RANGE) -> str:
    """Share of the profiled GPU span with a kernel, memcpy or memset running, per rank."""
    idle = ratio_per_rank(
        scope,
        contract.KERNEL_GPU_IDLE_SECONDS_TOTAL,
        contract.KERNEL_SPAN_SECONDS_TOTAL,
        over,
    )
    return f"1 - (\n{idle}\n)"


def launch_latency(scope: Scope, q: str, over: str = RANGE) -> str:
    buckets = scope.sel(contract.KERNEL_LAUNCH_LATENCY_SECONDS + "_bucket")
    return f"histogram_quantile({q}, sum by (le) (increase({buckets}[{over}])))"


def split_by(
    scope: Scope,
    panel: Callable[..., ui.Panel],
    title: str,
    metric: str,
    by: str,
    top: bool = False,
    **options: Any,
) -> ui.Panel:
    """A `panel` (ui.bargauge, ui.piechart) of `metric`'s increase over the range, one value
    per value of the label `by` (only the `TOP` largest with `top`)."""
    query = top_by(scope, metric, by) if top else increase_by(scope, metric, by)
    return panel(title, [target(query, f"{{{{{by}}}}}", instant=True)], **options)


def kernels_row(scope: Scope) -> ui.Row:
    return ui.row(
        "GPU kernels",
        collapsed=True,
        panels=[
            ui.bargauge(
                "GPU active in profiled windows",
                [target(active_share(scope), "rank {{rank}}", instant=True)],
                unit=ui.RATIO,
                w=8,
                description="Share of each rank's profiled GPU time span (first GPU activity "
                "to last) with a kernel, memcpy or memset running.",
            ),
            split_by(
                scope,
                ui.piechart,
                "GPU time by overlap class",
                contract.KERNEL_GPU_BUSY_SECONDS_TOTAL,
                "overlap",
                unit=ui.SECONDS,
                w=8,
                description="Busy time split by what ran at once: compute, communication "
                "(NCCL/RCCL), memory (memcpy, memset) and their overlaps.",
            ),
            ui.bargauge(
                "Idle between kernels inside steps",
                [
                    target(
                        ratio_per_rank(
                            scope,
                            contract.KERNEL_STEP_IDLE_SECONDS_TOTAL,
                            contract.KERNEL_STEP_WINDOW_SECONDS_TOTAL,
                        ),
                        "rank {{rank}}",
                        instant=True,
                    )
                ],
                unit=ui.RATIO,
                w=8,
                description="Within each profiled step's GPU window, the share with nothing "
                "running: high with short kernels means the step is launch-bound.",
            ),
            split_by(
                scope,
                ui.bargauge,
                f"Top {TOP} kernels by time",
                contract.KERNEL_SECONDS_TOTAL,
                "kernel",
                top=True,
                unit=ui.SECONDS,
                w=12,
                h=10,
            ),
            split_by(
                scope,
                ui.bargauge,
                f"Top {TOP} kernels by launches",
                contract.KERNEL_LAUNCHES_TOTAL,
                "kernel",
                top=True,
                w=12,
                h=10,
            ),
            split_by(
                scope,
                ui.piechart,
                "Kernel precision",
                contract.KERNEL_PRECISION_SECONDS_TOTAL,
                "precision",
                unit=ui.SECONDS,
                w=8,
                description="Kernel time by precision read from kernel names (see "
                "trainprof.trace.classify for the heuristics).",
            ),
            split_by(
                scope,
                ui.piechart,
                "GPU activity",
                contract.KERNEL_ACTIVITY_SECONDS_TOTAL,
                "activity",
                unit=ui.SECONDS,
                w=8,
            ),
            split_by(
                scope,
                ui.bargauge,
                "GPU memory operations (bytes)",
                contract.KERNEL_MEMCPY_BYTES_TOTAL,
                "activity",
                unit="bytes",
                w=8,
                description="Bytes copied by direction in the profiled windows.",
            ),
            ui.timeseries(
                "Launch latency (host call to device start)",
                [target(launch_latency(scope, q), f"p{float(q) * 100:g}") for q in ("0.5", "0.95")],
                unit=ui.SECONDS,
                w=12,
            ),
            split_by(
                scope,
                ui.bargauge,
                "CPU-GPU overlap",
                contract.KERNEL_HOST_DEVICE_BUSY_SECONDS_TOTAL,
                "side",
                unit=ui.SECONDS,
                w=12,
                description="Time the host ran operators (cpu), the GPU ran anything (gpu), "
                "and both at once (both) in the profiled windows.",
            ),
            split_by(
                scope,
                ui.bargauge,
                f"Top {TOP} CPU operators",
                contract.KERNEL_CPU_OP_SECONDS_TOTAL,
                "op",
                top=True,
                unit=ui.SECONDS,
                w=24,
                description="Host time of PyTorch operators in the profiled windows "
                "(inclusive of the operators they call); present on CPU-only runs too.",
            ),
        ],
    )

"""Profiled windows folded into bounded Prometheus series (`trainprof_kernel_*`).

    series = KernelSeries(top=10)
    series.add_window(read_trace("window.pt.trace.json.gz"), steps=20, overhead=0.004)
    families = list(series.families(["training_job", "rank"], ["bert", "0"]))

Bounds: each window adds its `top` kernels (by GPU time, shortened names) and its `top` CPU
operators; at most `max_labels` distinct names are ever kept per series, later ones go to
`other`, so a long job cannot grow the exposition without limit.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator

from trainprof.contract import metrics as contract
from trainprof.contract.sampling import Families, Histogram
from trainprof.trace import classify
from trainprof.trace.load import Trace
from trainprof.trace.summary import launch_latencies, summarize

OTHER = "other"
NS = 1e-9


class _Bounded:
    """Counters by name, at most `limit` names besides `other`."""

    def __init__(self, limit: int):
        self.limit = limit
        self.values: dict[str, float] = defaultdict(float)

    def add(self, name: str, value: float) -> str:
        """Count `value` under `name`, or `other` once the names are full; returns which."""
        if name not in self.values and len(self.values) >= self.limit:
            name = OTHER
        self.values[name] += value
        return name


class KernelSeries:
    def __init__(self, top: int = 10, max_labels: int = 50):
        self.top = top
        self.lock = threading.Lock()
        self.windows: dict[str, int] = defaultdict(int)
        self.steps = 0
        self.overhead = 0.0
        self.last_window: float | None = None
        self.gpu: tuple[str, str] | None = None
        self.totals: dict[str, float] = defaultdict(float)
        self.busy: dict[str, float] = defaultdict(float)
        self.kernel_seconds = _Bounded(max_labels)
        self.kernel_launches: dict[str, float] = defaultdict(float)
        self.activity: dict[str, float] = defaultdict(float)
        self.precision: dict[tuple[str, str], float] = defaultdict(float)
        self.memcpy_bytes: dict[str, float] = defaultdict(float)
        self.host_device: dict[str, float] = defaultdict(float)
        self.cpu_ops = _Bounded(max_labels)
        self.latency = Histogram(contract.LAUNCH_LATENCY_BUCKETS)

    def add_window(self, trace: Trace, steps: int, overhead: float) -> dict:
        """Fold one window's trace in; returns its summary."""
        # A window stops the profiler at a step boundary: its last step is whole.
        s = summarize(trace, top=len(trace.device) or 1, include_last_step=True)
        has_gpu = bool(trace.device)
        cpu_ops: dict[str, int] = defaultdict(int)
        for op in trace.cpu_ops:
            cpu_ops[op.name] += op.end - op.start
        latencies = launch_latencies(trace)
        with self.lock:
            self.windows["yes" if has_gpu else "no"] += 1
            self.steps += steps
            self.overhead += overhead
            self.last_window = time.time()
            ranked = sorted(cpu_ops.items(), key=lambda kv: (-kv[1], kv[0]))
            for i, (name, ns) in enumerate(ranked):
                self.cpu_ops.add(name[:80] if i < self.top else OTHER, ns * NS)
            overlap = s["cpu_gpu_overlap"]
            self.host_device["cpu"] += overlap["cpu_busy_seconds"]
            if not has_gpu:
                return s
            self.host_device["gpu"] += overlap["gpu_busy_seconds"]
            self.host_device["both"] += overlap["both_busy_seconds"]
            gpu = s["gpu"]
            if gpu:
                self.gpu = (gpu["name"], "true" if gpu["tensor_cores"] else "false")
            self.totals["span"] += s["span_seconds"]
            self.totals["idle"] += s["idle_seconds"]
            self.totals["step_window"] += s["steps"].get("gpu_window_seconds", 0.0)
            self.totals["step_idle"] += s["steps"].get("gpu_idle_in_steps_seconds", 0.0)
            for k, v in s["gpu_time_seconds"].items():
                self.busy[k] += v
            for i, k in enumerate(s["top_kernels"]):
                name = classify.short_name(k["name"]) if i < self.top else OTHER
                name = self.kernel_seconds.add(name, k["seconds"])
                self.kernel_launches[name] += k["launches"]
            for k, v in s["activity_seconds"].items():
                self.activity[k] += v
            matmul = s["matmul_precision_seconds"]
            for k, v in s["precision_seconds"].items():
                self.precision[(k, "matmul")] += matmul.get(k, 0.0)
                self.precision[(k, "other")] += v - matmul.get(k, 0.0)
            for name, m in s["memory_operations"].items():
                activity = classify.activity(name, "memcpy" if name.startswith("Memcpy") else "")
                if activity.startswith("memcpy"):
                    self.memcpy_bytes[activity] += m["bytes"]
                if m["pageable"]:
                    self.totals["pageable"] += m["seconds"]
            for ns in latencies:
                self.latency.observe(ns * NS)
        return s

    def families(self, ident_names: list[str], ident: list[str]) -> Iterator:
        """The series as metric families, rendered under the lock in one go."""
        with self.lock:
            return iter(list(self._families(ident_names, ident)))

    def _families(self, ident_names: list[str], ident: list[str]) -> Iterator:
        fam = Families(ident_names)
        yield fam.counter(
            contract.KERNEL_PROFILE_WINDOWS_TOTAL,
            ["gpu_activity"],
            [(ident + [k], v) for k, v in sorted(self.windows.items())],
        )
        yield fam.counter(contract.KERNEL_PROFILED_STEPS_TOTAL, [], [(ident, self.steps)])
        yield fam.counter(
            contract.KERNEL_PROFILE_OVERHEAD_SECONDS_TOTAL, [], [(ident, self.overhead)]
        )
        yield from fam.known(contract.KERNEL_LAST_WINDOW_TIMESTAMP_SECONDS, ident, self.last_window)
        yield fam.counter(
            contract.KERNEL_HOST_DEVICE_BUSY_SECONDS_TOTAL,
            ["side"],
            [(ident + [k], v) for k, v in sorted(self.host_device.items())],
        )
        yield fam.counter(
            contract.KERNEL_CPU_OP_SECONDS_TOTAL,
            ["op"],
            [(ident + [k], v) for k, v in sorted(self.cpu_ops.values.items())],
        )
        if not self.windows.get("yes"):
            return  # no GPU activity profiled yet: the GPU series are absent, not zero
        if self.gpu:
            yield fam.gauge(
                contract.KERNEL_GPU_INFO,
                ["gpu_name", "tensor_cores"],
                [(ident + list(self.gpu), 1)],
            )
        for name, key in (
            (contract.KERNEL_SPAN_SECONDS_TOTAL, "span"),
            (contract.KERNEL_GPU_IDLE_SECONDS_TOTAL, "idle"),
            (contract.KERNEL_STEP_WINDOW_SECONDS_TOTAL, "step_window"),
            (contract.KERNEL_STEP_IDLE_SECONDS_TOTAL, "step_idle"),
            (contract.KERNEL_MEMCPY_PAGEABLE_SECONDS_TOTAL, "pageable"),
        ):
            yield fam.counter(name, [], [(ident, self.totals.get(key, 0.0))])
        for name, label, values in (
            (contract.KERNEL_GPU_BUSY_SECONDS_TOTAL, "overlap", self.busy),
            (contract.KERNEL_SECONDS_TOTAL, "kernel", self.kernel_seconds.values),
            (contract.KERNEL_LAUNCHES_TOTAL, "kernel", self.kernel_launches),
            (contract.KERNEL_ACTIVITY_SECONDS_TOTAL, "activity", self.activity),
            (contract.KERNEL_MEMCPY_BYTES_TOTAL, "activity", self.memcpy_bytes),
        ):
            yield fam.counter(name, [label], [(ident + [k], v) for k, v in sorted(values.items())])
        yield fam.counter(
            contract.KERNEL_PRECISION_SECONDS_TOTAL,
            ["precision", "kernel_class"],
            [(ident + list(k), v) for k, v in sorted(self.precision.items())],
        )
        yield fam.histogram(contract.KERNEL_LAUNCH_LATENCY_SECONDS, [], [(ident, self.latency)])

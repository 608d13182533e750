"""One rank's kernel-level summary: the JSON contract of `trainprof trace summarize`.

    >>> from trainprof.trace.load import read_trace
    >>> s = summarize(read_trace("tests/data/real-gpu-traces/a100-alexnet.pt.trace.json.gz"))
    >>> s["span_seconds"], s["idle_seconds"], s["gpu_time_seconds"]
    (12.920244, 12.854103, {'compute': 0.01063, 'memory': 0.055511})
    >>> nccl = read_trace("tests/data/real-gpu-traces/a100-nccl-training.pt.trace.json.gz")
    >>> summarize(nccl)["span_seconds"], summarize(nccl, include_last_step=True)["span_seconds"]
    (0.435587562, 0.660551006)

Definitions (all from device timestamps; a class or key with no time is left out):
- window: the part of the trace summarized (`trace.window`): as Holistic Trace Analysis
  by default, the GPU work launched before the last profiler step began; everything below
  is of that window;
- span: first GPU activity (kernel, memcpy, memset) start to the last one's end;
- idle: span minus the union of all GPU activity;
- gpu_time_seconds: the busy time split by which classes run at that instant (compute =
  kernels that are not collectives, communication = NCCL/RCCL collectives, memory = memcpy
  and memset); the classes are exclusive and sum to span - idle;
- top_kernels: per name as the trace writes it (memcpy and memset included), total device
  duration and launches, longest first;
- precision_seconds, activity_seconds: summed durations (not exclusive: two kernels on two
  streams both count);
- launch_latency_seconds: device start minus the start of the host call that launched it
  (paired by `correlation`): count, mean, p50, p95, max;
- beyond the contract, for the report: top kernels by launches, memory operations, steps
  (`ProfilerStep#N`), idle inside steps, user annotations, CPU-GPU overlap.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from trainprof.trace import classify
from trainprof.trace.intervals import (
    clipped_length,
    exclusive_overlap,
    intersection_length,
    merged,
)
from trainprof.trace.load import Trace
from trainprof.trace.window import windowed

NS = 1e-9
DEFAULT_TOP = 15
STEP_ANNOTATION = re.compile(r"^ProfilerStep#\d+$")


def _seconds(ns: float) -> float:
    return round(ns * NS, 9)


def _quantile(sorted_values: list[int], q: float) -> int:
    """Nearest-rank quantile of an ascending list."""
    index = max(0, min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def distribution(values_ns: Iterable[int]) -> dict[str, float]:
    values = sorted(values_ns)
    if not values:
        return {"count": 0}
    return {
        "count": len(values),
        "mean": _seconds(sum(values) / len(values)),
        "p50": _seconds(_quantile(values, 0.5)),
        "p95": _seconds(_quantile(values, 0.95)),
        "max": _seconds(values[-1]),
    }


def overlap_class_names(mask: int) -> str:
    return "+".join(c for i, c in enumerate(classify.OVERLAP_CLASSES) if mask & (1 << i))


def summarize(
    trace: Trace, top: int = DEFAULT_TOP, include_last_step: bool = False
) -> dict[str, Any]:
    """The summary of `trace` within its window (`trace.window`: by default HTA's, the last
    profiler step left out; `include_last_step` keeps it); `top` kernels listed."""
    trace, window = windowed(trace, include_last_step)
    events = trace.device
    out: dict[str, Any] = {"window": window}
    if not events:
        out.update(span_seconds=0.0, idle_seconds=0.0, gpu_time_seconds={}, top_kernels=[])
        out.update(precision_seconds={}, activity_seconds={}, launch_latency_seconds={"count": 0})
    else:
        _device_time(trace, out, top)
    out["gpu"] = _gpu(trace)
    out["steps"] = _steps(trace)
    out["annotations"] = _annotations(trace)
    out["cpu_gpu_overlap"] = _cpu_gpu_overlap(trace)
    out["skipped_events"] = trace.skipped
    return out


def _device_time(trace: Trace, out: dict[str, Any], top: int) -> None:
    events = trace.device
    start = min(e.start for e in events)
    end = max(e.end for e in events)
    index = {c: i for i, c in enumerate(classify.OVERLAP_CLASSES)}
    by_mask = exclusive_overlap(
        ((e.start, e.end, index[classify.overlap_class(e.name, e.kind)]) for e in events),
        len(index),
    )
    busy = sum(by_mask.values())
    out["span_seconds"] = _seconds(end - start)
    out["idle_seconds"] = _seconds(end - start - busy)
    out["gpu_time_seconds"] = {
        overlap_class_names(mask): _seconds(ns) for mask, ns in sorted(by_mask.items())
    }

    per_name: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    precision: dict[str, int] = defaultdict(int)
    matmul_precision: dict[str, int] = defaultdict(int)
    activity: dict[str, int] = defaultdict(int)
    memory: dict[str, dict[str, int]] = defaultdict(lambda: {"count": 0, "ns": 0, "bytes": 0})
    for e in events:
        duration = e.end - e.start
        row = per_name[e.name]
        row[0] += duration
        row[1] += 1
        activity[classify.activity(e.name, e.kind)] += duration
        if e.kind == "kernel":
            label = classify.precision(e.name)
            precision[label] += duration
            if classify.is_matmul(e.name):
                matmul_precision[label] += duration
        else:
            m = memory[e.name]
            m["count"] += 1
            m["ns"] += duration
            m["bytes"] += e.nbytes or 0
    for sync in trace.syncs:
        activity["sync"] += sync.end - sync.start

    def kernel_row(name: str) -> dict[str, Any]:
        return {"name": name, "seconds": _seconds(per_name[name][0]), "launches": per_name[name][1]}

    by_time = sorted(per_name, key=lambda n: (-per_name[n][0], n))
    by_launches = sorted(per_name, key=lambda n: (-per_name[n][1], -per_name[n][0], n))
    out["top_kernels"] = [kernel_row(n) for n in by_time[:top]]
    out["top_kernels_by_launches"] = [kernel_row(n) for n in by_launches[:top]]
    out["kernels"] = {
        "distinct": len(per_name),
        "launches": sum(r[1] for r in per_name.values()),
        "seconds": _seconds(sum(r[0] for r in per_name.values())),
    }
    out["precision_seconds"] = {k: _seconds(v) for k, v in sorted(precision.items())}
    out["matmul_precision_seconds"] = {k: _seconds(v) for k, v in sorted(matmul_precision.items())}
    out["activity_seconds"] = {k: _seconds(v) for k, v in sorted(activity.items())}
    out["memory_operations"] = {
        name: {
            "count": m["count"],
            "seconds": _seconds(m["ns"]),
            "bytes": m["bytes"],
            "pageable": classify.is_pageable(name),
        }
        for name, m in sorted(memory.items())
    }
    out["launch_latency_seconds"] = distribution(launch_latencies(trace))


def launch_latencies(trace: Trace) -> list[int]:
    """Device start minus host launch start (ns) of every event paired by correlation."""
    latencies = []
    for e in trace.device:
        launch = trace.launches.get(e.correlation) if e.correlation is not None else None
        if launch is not None and e.start >= launch.start:
            latencies.append(e.start - launch.start)
    return latencies


def _gpu(trace: Trace) -> dict[str, Any]:
    """The first GPU this rank used, from deviceProperties: name and whether it has tensor
    cores (NVIDIA compute capability >= 7.0; AMD Instinct MI100 and later, gfx908+)."""
    used = {e.device for e in trace.device}
    props = [g for g in trace.gpus if g.get("id") in used] or trace.gpus
    if not props:
        return {}
    g = props[0]
    name = str(g.get("name", ""))
    major = g.get("computeMajor")
    tensor_cores = None
    if "NVIDIA" in name.upper() or "TESLA" in name.upper():
        tensor_cores = isinstance(major, int) and major >= 7
    elif "AMD" in name.upper() or "RADEON" in name.upper() or "INSTINCT" in name.upper():
        tensor_cores = isinstance(major, int) and major >= 9
    return {"name": name, "compute_capability": major, "tensor_cores": tensor_cores}


def _step_windows(trace: Trace) -> list[tuple[str, int, int]]:
    return sorted(
        ((a.name, a.start, a.end) for a in trace.annotations if STEP_ANNOTATION.match(a.name)),
        key=lambda w: w[1],
    )


def _steps(trace: Trace) -> dict[str, Any]:
    """Step durations (host) and, per step, the GPU work its launches caused: the device
    window from the first to the last of those events and the idle time inside it."""
    windows = _step_windows(trace)
    if not windows:
        return {"count": 0}
    busy = merged((e.start, e.end) for e in trace.device)
    caused_by = sorted(
        (trace.launches[e.correlation].start, e.start, e.end)
        for e in trace.device
        if e.correlation in trace.launches
    )
    launch_times = [c[0] for c in caused_by]
    idle_in_steps = 0
    device_windows = []
    for _, s, t in windows:
        caused = caused_by[
            bisect.bisect_left(launch_times, s) : bisect.bisect_left(launch_times, t)
        ]
        if caused:
            first, last = min(c[1] for c in caused), max(c[2] for c in caused)
            idle_in_steps += (last - first) - clipped_length(busy, first, last)
            device_windows.append(last - first)
    return {
        "count": len(windows),
        "durations_seconds": [_seconds(t - s) for _, s, t in windows],
        "duration": distribution(t - s for _, s, t in windows),
        "gpu_window_seconds": _seconds(sum(device_windows)),
        "gpu_idle_in_steps_seconds": _seconds(idle_in_steps),
    }


def _annotations(trace: Trace) -> dict[str, Any]:
    """User annotations (`record_function` ranges) other than the profiler's steps."""
    by_name: dict[str, list[int]] = defaultdict(list)
    for a in trace.annotations:
        if not STEP_ANNOTATION.match(a.name):
            by_name[a.name].append(a.end - a.start)
    return {
        name: {
            **distribution(d),
            "seconds": _seconds(sum(d)),
            "durations_seconds": [_seconds(x) for x in d],
        }
        for name, d in sorted(by_name.items())
    }


def _cpu_gpu_overlap(trace: Trace) -> dict[str, float]:
    """Host busy (union of CPU ops), GPU busy, and the time both are busy at once."""
    cpu = merged((s.start, s.end) for s in trace.cpu_ops)
    gpu = merged((e.start, e.end) for e in trace.device)
    return {
        "cpu_busy_seconds": _seconds(sum(b - a for a, b in cpu)),
        "gpu_busy_seconds": _seconds(sum(b - a for a, b in gpu)),
        "both_busy_seconds": _seconds(intersection_length(cpu, gpu)),
    }


def summarize_all(
    traces: Iterable[Trace], top: int = DEFAULT_TOP, include_last_step: bool = False
) -> dict[str, Any]:
    """{"ranks": {"<rank>": summary}} for traces of distinct ranks."""
    return {
        "ranks": {
            str(t.rank): summarize(t, top, include_last_step)
            for t in sorted(traces, key=lambda t: t.rank)
        }
    }

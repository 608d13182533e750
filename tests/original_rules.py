"""A test oracle: SageMaker's profiler rules as RULE-SEMANTICS.md describes them, decided
in Python straight from the samples (scan windows, patience as warm-up, sticky verdicts),
with DESIGN.md's decisions where the original code was buggy (GPUMemoryIncrease compares a
window with the one before it; LoadBalancing compares the GPUs of a host).

Replay never uses this: it evaluates the real PromQL. Tests use it to check that the PromQL
reaches the original verdict on clear-cut timelines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from trainprof.contract.sampling import HostSample


def js_distance(p_counts: Sequence[int], q_counts: Sequence[int]) -> float | None:
    """Jensen-Shannon distance, natural log, written here as the entropy of the mixture less
    the mean entropy, JSD = H((P+Q)/2) - (H(P)+H(Q))/2 (RULE-SEMANTICS.md writes it with
    KL divergences, as the code under test does): an oracle computes on its own."""
    n_p, n_q = sum(p_counts), sum(q_counts)
    if not n_p or not n_q:
        return None

    def entropy(dist) -> float:
        return -sum(x * math.log(x) for x in dist if x > 0)

    p = [c / n_p for c in p_counts]
    q = [c / n_q for c in q_counts]
    mixture = [(a + b) / 2 for a, b in zip(p, q)]
    return math.sqrt(max(entropy(mixture) - (entropy(p) + entropy(q)) / 2, 0.0))


def quantile(values: Sequence[float], q: float) -> float:
    """numpy.quantile's default (linear) definition."""
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _windows(hosts: Mapping[str, list[HostSample]], scan: float):
    first = min(s[0].timestamp for s in hosts.values())
    last = max(s[-1].timestamp for s in hosts.values())
    t0 = math.floor(first / 60) * 60
    k = 0
    while t0 + (k + 1) * scan <= last:
        yield t0 + k * scan, t0 + (k + 1) * scan
        k += 1


def _in(samples: list[HostSample], start: float, end: float) -> list[HostSample]:
    return [s for s in samples if start < s.timestamp <= end]


def bottleneck(hosts, p, io: bool = False) -> bool:
    busy_limit = (p["io_threshold"] if io else p["cpu_threshold"]) / 100
    datapoints = hits = 0
    for start, end in _windows(hosts, p["scan_interval_us"] / 1e6):
        for samples in hosts.values():
            for s in _in(samples, start, end):
                datapoints += 1
                busy = s.cpu_iowait if io else s.cpu_utilization
                utils = [g.utilization for g in s.gpus if g.utilization is not None]
                if (
                    busy
                    and utils
                    and max(busy) > busy_limit
                    and min(utils) < p["gpu_threshold"] / 100
                ):
                    hits += 1
        if datapoints > p["patience"] and 100 * hits / datapoints > p["threshold"]:
            return True
    return False


def _per_gpu(hosts, start, end, field):
    for node, samples in hosts.items():
        for s in _in(samples, start, end):
            for g in s.gpus:
                value = getattr(g, field)
                if value is not None:
                    yield (node, g.index), value


def low_gpu_utilization(hosts, p) -> bool:
    seen: dict = {}
    for start, end in _windows(hosts, p["scan_interval_us"] / 1e6):
        for key, value in _per_gpu(hosts, start, end, "utilization"):
            seen.setdefault(key, []).append(value)
        for values in seen.values():
            if len(values) <= p["patience"]:
                continue
            last = values[-p["window"] :]
            p95, p5 = quantile(last, 0.95), quantile(last, 0.05)
            t95, t5 = p["threshold_p95"] / 100, p["threshold_p5"] / 100
            if p95 < t95 or (p95 > t95 and p5 < t5):
                return True
    return False


def batch_size(hosts, p) -> bool:
    cpu: dict = {}
    util: dict = {}
    mem: dict = {}
    for start, end in _windows(hosts, p["scan_interval_us"] / 1e6):
        for node, samples in hosts.items():
            for s in _in(samples, start, end):
                if s.cpu_utilization:
                    cpu.setdefault(node, []).append(sum(s.cpu_utilization) / len(s.cpu_utilization))
                for g in s.gpus:
                    util.setdefault((node, g.index), []).append(g.utilization)
                    mem.setdefault((node, g.index), []).append(g.memory_used_ratio)
        w = p["window"]
        for node, values in cpu.items():
            if len(values) <= w or len(values) <= p["patience"]:
                continue
            if quantile(values[-w:], 0.95) >= p["cpu_threshold_p95"] / 100:
                continue
            for (gpu_node, _), u in util.items():
                m = mem[(gpu_node, _)]
                if (
                    gpu_node == node
                    and len(u) > w
                    and quantile(u[-w:], 0.95) < p["gpu_threshold_p95"] / 100
                    and quantile(m[-w:], 0.95) < p["gpu_memory_threshold_p95"] / 100
                ):
                    return True
    return False


def gpu_memory_increase(hosts, p) -> bool:
    w = p["window"]
    for samples in hosts.values():
        series: dict = {}
        for s in samples:
            for g in s.gpus:
                values = series.setdefault(g.index, [])
                values.append(g.memory_used_ratio)
                if len(values) > p["patience"] and len(values) >= 2 * w:
                    rise = sum(values[-w:]) / w - sum(values[-2 * w : -w]) / w
                    if rise > p["increase"] / 100:
                        return True
    return False


def load_balancing(hosts, p) -> bool:
    bins: dict = {}
    for start, end in _windows(hosts, p["scan_interval_us"] / 1e6):
        for (node, gpu), value in _per_gpu(hosts, start, end, "utilization"):
            counts = bins.setdefault(node, {}).setdefault(gpu, [0] * 50)
            counts[min(int(value * 50), 49)] += 1
        for gpus in bins.values():
            names = sorted(gpus)
            for i, a in enumerate(names):
                for b in names[i + 1 :]:
                    d = js_distance(gpus[a], gpus[b])
                    if d is not None and d > p["threshold"] and sum(gpus[a]) > p["patience"]:
                        return True
    return False


def step_outlier(steps, p) -> bool:
    """Per (node, rank) and mode: once more than 100 durations exist, count those above
    mean + stddev * std of all of them; fire when more than n_outliers."""
    groups: dict = {}
    for step in steps:
        if p.get("mode") and step.mode != p["mode"]:
            continue
        groups.setdefault((step.node, step.rank, step.mode), []).append(step.end - step.start)
    for durations in groups.values():
        if len(durations) <= 100:
            continue
        mean = sum(durations) / len(durations)
        std = math.sqrt(sum((d - mean) ** 2 for d in durations) / len(durations))
        if sum(d > mean + p["stddev"] * std for d in durations) > p["n_outliers"]:
            return True
    return False


DECIDE = {
    "CPUBottleneck": lambda h, p: bottleneck(h, p),
    "IOBottleneck": lambda h, p: bottleneck(h, p, io=True),
    "LowGPUUtilization": low_gpu_utilization,
    "BatchSize": batch_size,
    "GPUMemoryIncrease": gpu_memory_increase,
    "LoadBalancing": load_balancing,
    "StepOutlier": step_outlier,
}

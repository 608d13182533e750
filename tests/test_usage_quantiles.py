"""The exporter's served percentiles equal what Prometheus' own `histogram_quantile` computes
from the buckets it serves beside them, so OverallSystemUsage can read them instead.

The oracle is promtool's rule engine over one scrape of each host's exposition.
"""

from __future__ import annotations

import itertools
import random

from trainprof.contract import metrics as contract
from trainprof.contract.sampling import GpuSample, HostSample, SampleAccumulator, samples_of
from trainprof.engines.promtool import run_rules, series_text

HISTOGRAMS = (
    "trainprof_cpu_utilization_sampled_ratio",
    "trainprof_cpu_iowait_sampled_ratio",
    "trainprof_memory_used_sampled_ratio",
    "trainprof_node_gpu_utilization_sampled_ratio",
    "trainprof_node_gpu_memory_used_sampled_ratio",
)


def _host(name: str, draw, samples: int) -> SampleAccumulator:
    acc = SampleAccumulator(0.5, identity={"node": name})
    for i in range(samples):
        acc.observe(
            HostSample(
                0.5 * i,
                cpu_utilization=[draw(), draw()],
                cpu_iowait=[draw(), draw()],
                memory_used_ratio=draw(),
                gpus=[
                    GpuSample(g, f"GPU-{name}-{g}", utilization=draw(), memory_used_ratio=draw())
                    for g in range(2)
                ],
            )
        )
    return acc


def _alternating(a: float, b: float):
    values = itertools.cycle((a, b))
    return lambda: next(values)


def _hosts() -> list[SampleAccumulator]:
    rng = random.Random(7)
    bounds = contract.UTILIZATION_BUCKETS
    return [
        _host("uniform", rng.random, 400),
        _host("idle", lambda: 0.0, 50),  # every sample in the le="0" bucket
        _host("on-bounds", lambda: rng.choice(bounds), 300),  # exactly on bucket bounds
        _host("busy", lambda: 1.0, 20),
        _host("skewed", lambda: rng.random() ** 6, 333),
        _host("one-sample", lambda: 0.37, 1),
        _host("over-one", lambda: 1.0 + rng.random(), 30),  # the +Inf bucket
        # Half the samples at 0.1, half at 0.9: the median's rank equals a cumulative count,
        # with empty buckets above it.
        _host("two-modes", _alternating(0.1, 0.9), 40),
    ]


def test_served_quantiles_equal_prometheus_histogram_quantile(tmp_path, promtool):
    series = {}
    for acc in _hosts():
        for name, labels, value in samples_of(acc.families()):
            series[series_text(name, labels)] = [value, value]
    queries = {}
    for histogram in HISTOGRAMS:
        served = contract.usage_quantiles_of(histogram)
        for q in contract.USAGE_QUANTILES:
            queries[f"prometheus.{histogram}.{q}"] = (
                f"histogram_quantile({q:g}, {histogram}_bucket)",
                [15.0],
            )
            queries[f"served.{histogram}.{q}"] = (f'{served}{{quantile="{q:g}"}}', [15.0])
    run = run_rules([], series, 15.0, 15.0, 15.0, tmp_path, promtool, queries=queries)

    compared = 0
    for histogram in HISTOGRAMS:
        for q in contract.USAGE_QUANTILES:
            expected = {
                labels["node"]: value
                for labels, value in run.queries[f"prometheus.{histogram}.{q}"][15.0]
            }
            got = {
                labels["node"]: value
                for labels, value in run.queries[f"served.{histogram}.{q}"][15.0]
            }
            assert got.keys() == expected.keys() and len(got) == 8, (histogram, q)
            for node, value in expected.items():
                assert got[node] == value, (histogram, q, node)
                compared += 1
    assert compared == len(HISTOGRAMS) * len(contract.USAGE_QUANTILES) * 8


def test_a_histogram_without_samples_serves_no_quantiles():
    """histogram_quantile gives NaN there; an absent percentile keeps NaN out of the
    dashboards and of replay's series."""
    acc = SampleAccumulator(0.5, identity={"node": "n1"})
    acc.observe(HostSample(0.0, cpu_utilization=[0.5], cpu_iowait=[], memory_used_ratio=None))
    served = {
        (name, labels.get("quantile")): v
        for name, labels, v in samples_of(acc.families())
        if "_quantile_ratio" in name
    }
    # one sample in the bucket (0.45, 0.5]: the median is interpolated to its middle
    assert served[("trainprof_cpu_utilization_quantile_ratio", "0.5")] == 0.475
    assert ("trainprof_cpu_iowait_quantile_ratio", "0.5") not in served
    assert served[("trainprof_cpu_iowait_quantile_ratio_count", None)] == 0

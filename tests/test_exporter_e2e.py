"""End to end: the real exporter, scraped by two real Prometheus servers at once, one every
second and one every 15 seconds, while a scripted pattern plays; the compiled
LowGPUUtilization and CPUBottleneck rules must reach the same values and verdicts at both
scrape intervals (within a histogram bucket), and the exporter's recording of the run must
replay to the same verdicts.

The pattern repeats every 4 samples (2 s), which no scrape interval here divides evenly into
whole sample sets: a 15 s scrape of a latest-value gauge would see GPU 0 idle or busy depending
on the phase, while the exporter's histograms and counters hold every sample.

    sample           0     1     2     3
    GPU 0 util       2%    2%    2%    95%    -> fluctuating: 3/4 of the samples <= 10% and
                                                 <= 70%; p5 in (0, 5%], p95 in (90, 95%]
    GPU 1 util       50%   50%   50%   50%    -> underutilized: all <= 70%, none <= 10%;
                                                 p95 in (45, 50%]
    core 0 busy      95%   95%   95%   30%    -> 3 of 4 samples are CPU bottlenecks (> 50%)
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import trainprof.exporter
from trainprof.exporter.sources.gpu import GpuSource
from trainprof.generation.render import to_yaml
from trainprof.replay import replay
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config

from fakes import FakeGpu, FakeNvml, ScriptedCpu
from servers import prometheus, query

RULES = {
    "datapoint_interval": "0.5s",
    "scrape_interval": "15s",  # windows at least two 15 s scrapes long
    "rules": [
        {
            "rule": "LowGPUUtilization",
            "parameters": {"window": 80, "patience": 10, "scan_interval_us": 1_000_000},
        },
        {"rule": "CPUBottleneck", "parameters": {"patience": 10, "scan_interval_us": 1_000_000}},
    ],
}
BELOW70 = "gpu:trainprof_gpu_utilization_sampled_ratio:fraction_below70_rate40s"
BELOW10 = "gpu:trainprof_gpu_utilization_sampled_ratio:fraction_below10_rate40s"
P95 = "histogram_quantile(0.95, rate(trainprof_gpu_utilization_sampled_ratio_bucket[40s]))"
P5 = "histogram_quantile(0.05, rate(trainprof_gpu_utilization_sampled_ratio_bucket[40s]))"
CPU_RATIO = 'training_job:trainprof_cpu_bottleneck_samples:ratio{cpu_above="0.9",gpu_below="0.1"}'
BUCKET = 0.05

EXPECTED = {  # (query, gpu) -> the range the value must fall in
    (BELOW70, "0"): (0.70, 0.80),
    (BELOW10, "0"): (0.70, 0.80),
    (BELOW70, "1"): (1.0, 1.0),
    (BELOW10, "1"): (0.0, 0.0),
    (P95, "0"): (0.90, 0.95),
    (P5, "0"): (0.0, 0.05),
    (P95, "1"): (0.45, 0.50),
    (P5, "1"): (0.45, 0.50),
    (CPU_RATIO, None): (0.70, 0.80),
}
# One alert per rule and reason; the GPU each found beside it (its affected recording).
FIRING = {
    ("TrainingLowGPUUtilization", None, "fluctuating"),
    ("TrainingLowGPUUtilization", None, "underutilized"),
    ("TrainingCPUBottleneck", None, None),
}
FOUND = {
    ("LowGPUUtilization", "0", "fluctuating"),
    ("LowGPUUtilization", "1", "underutilized"),
    ("CPUBottleneck", None, None),
}


def scrape_config(port: int, interval: str) -> str:
    return (
        f"global: {{scrape_interval: {interval}, scrape_timeout: 1s, "
        "evaluation_interval: 1s}\n"
        "rule_files: [rules.yaml]\n"
        "scrape_configs:\n"
        "  - job_name: trainprof\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
    )


def values(base: str) -> dict:
    out = {}
    for expr, gpu in EXPECTED:
        for r in query(base, expr)["data"]["result"]:
            if gpu is None or r["metric"].get("gpu") == gpu:
                out[(expr, gpu)] = float(r["value"][1])
    return out


def firing(base: str) -> set:
    result = query(base, 'ALERTS{alertstate="firing"}')["data"]["result"]
    return {
        (r["metric"]["alertname"], r["metric"].get("gpu"), r["metric"].get("reason"))
        for r in result
    }


def found(base: str) -> set:
    result = query(base, '{__name__=~".+:trainprof_rule_.+:affected"}')["data"]["result"]
    return {
        (r["metric"]["rule"], r["metric"].get("gpu"), r["metric"].get("reason")) for r in result
    }


def scrapes(base: str) -> int:
    result = query(base, "count_over_time(trainprof_samples_total[10m])")["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


def test_rules_reach_the_same_values_at_1s_and_15s_scrape_intervals(
    prometheus_bin, promtool, tmp_path
):
    rules = to_yaml({"groups": compile_rules(load_config(RULES)).groups})
    gpus = [FakeGpu("GPU-e2e-0", utilization=[2, 2, 2, 95]), FakeGpu("GPU-e2e-1", utilization=[50])]
    cpu = ScriptedCpu([([0.95, 0.2], [0.0, 0.0])] * 3 + [([0.3, 0.2], [0.0, 0.0])])
    exporter = trainprof.exporter.start(
        0,
        address="127.0.0.1",
        sources=[GpuSource(FakeNvml(gpus)), cpu],
        identity={"training_job": "e2e", "node": "n1"},
        datapoint_interval=0.5,
        record=str(tmp_path / "recording.jsonl"),
    )
    fast_dir, slow_dir = Path(tmp_path / "1s"), Path(tmp_path / "15s")
    fast_dir.mkdir()
    slow_dir.mkdir()
    try:
        with (
            prometheus(
                prometheus_bin, fast_dir, scrape_config(exporter.port, "1s"), {"rules.yaml": rules}
            ) as fast,
            prometheus(
                prometheus_bin, slow_dir, scrape_config(exporter.port, "15s"), {"rules.yaml": rules}
            ) as slow,
        ):
            deadline = time.monotonic() + 150
            while True:
                # Three 15 s scrapes: the 40 s windows hold two scrape intervals of samples.
                got = {"1s": values(fast), "15s": values(slow)}
                ready = scrapes(slow) >= 3 and all(len(v) == len(EXPECTED) for v in got.values())
                if ready and firing(fast) >= FIRING and firing(slow) >= FIRING:
                    break
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"rules never settled: values {got}, firing 1s "
                        f"{firing(fast)}, 15s {firing(slow)}, 15s scrapes "
                        f"{scrapes(slow)}"
                    )
                time.sleep(1)
            assert firing(fast) == firing(slow) == FIRING
            assert found(fast) == found(slow) == FOUND
    finally:
        exporter.stop()

    for key in EXPECTED:  # shown with pytest -s
        print(f"{key[0]} gpu={key[1]}: 1s {got['1s'][key]:.4f}  15s {got['15s'][key]:.4f}")
    for key, (low, high) in EXPECTED.items():
        fast_value, slow_value = got["1s"][key], got["15s"][key]
        assert low <= fast_value <= high, f"{key} at 1s: {fast_value}"
        assert low <= slow_value <= high, f"{key} at 15s: {slow_value}"
        assert abs(fast_value - slow_value) <= BUCKET, (key, fast_value, slow_value)

    # The exporter's recording of the same run replays to the live verdicts.
    for scrape in (1.0, 15.0):
        config = load_config({**RULES, "scrape_interval": f"{scrape:g}s"})
        result = replay(str(tmp_path / "recording.jsonl"), config, scrape_interval=scrape)
        replayed = {
            (a.labels["alertname"], a.labels.get("gpu"), a.labels.get("reason"))
            for verdict in result.rules.values()
            for a in verdict.alerts
        }
        assert replayed == FIRING, f"replay at {scrape:g}s"
        units = {
            (name, u.labels.get("gpu"), u.labels.get("reason"))
            for name, verdict in result.rules.items()
            for u in verdict.affected
        }
        assert units >= FOUND, f"replay at {scrape:g}s"

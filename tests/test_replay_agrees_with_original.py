"""On clear-cut SageMaker timelines the replayed PromQL reaches the original rules' verdict,
at any scrape interval from 1 s to 60 s.

Cases are drawn at random (fixed seed) around each rule's parameters: a condition that holds
the whole job with a wide margin, or is clearly absent. The oracle (`original_rules`) decides
from the raw samples as SageMaker did; the test checks that the case is what it claims to
be (oracle == expectation) and that replay agrees at every scrape interval.
"""

from __future__ import annotations

import random

import pytest

from original_rules import DECIDE
from trainprof.replay import load_timeline, replay
from trainprof.replay.synthetic import write_steps, write_system
from trainprof.rules.config import load_config

START = 1_700_000_040
# Every case at 15 s in the quick tier; at 1 s and 60 s (two thirds of the replays, the 1 s
# ones the longest) in the slow tier, which `make test` runs.
OTHER_SCRAPES = pytest.mark.slow(reason="each case replayed again at 1 s and 60 s scrapes")
SCRAPES = (pytest.param(1.0, marks=OTHER_SCRAPES), 15.0, pytest.param(60.0, marks=OTHER_SCRAPES))


def _cycle(fraction: float, hit, miss, length: int = 20):
    hits = round(fraction * length)
    return {"cycle": [hit] * hits + [miss] * (length - hits)}


def bottleneck_case(rng, n: int, io: bool):
    busy_param, busy_key = ("io_threshold", "iowait") if io else ("cpu_threshold", "cpu")
    threshold = rng.choice([30, 50, 70])
    busy = rng.choice([50, 70, 80, 90]) if io else rng.choice([70, 80, 90])
    idle = rng.choice([10, 20, 30])
    fires = n % 2 == 0
    fraction = (threshold + 20) / 100 if fires else (threshold - 20) / 100
    params = {
        "threshold": threshold,
        busy_param: busy,
        "gpu_threshold": idle,
        "patience": rng.choice([300, 600, 1000]),
    }
    core = _cycle(fraction, (busy + 5) / 100, (busy - 15) / 100)
    gpu = _cycle(fraction, (idle - 5) / 100, (idle + 15) / 100)
    hosts = {
        "algo-1": {
            "cores": 2,
            "gpus": 2,
            "timeline": [{busy_key: [core, 0.1], "gpu_util": [gpu, 0.95]}],
        }
    }
    return params, hosts, fires, params["patience"]


def low_gpu_case(rng, n: int):
    t95, t5 = rng.choice([50, 70, 80]), rng.choice([5, 10, 20])
    kind = ["under", "fine", "fluctuating", "busy-with-dips"][n % 4]
    if kind == "under":
        util = (t95 - 15) / 100
    elif kind == "fine":
        util = (t95 + 10) / 100
    elif kind == "fluctuating":
        util = _cycle(0.75, 0.97, 0.0)
    else:
        util = _cycle(0.75, 0.97, (t5 + 15) / 100)
    params = {
        "threshold_p95": t95,
        "threshold_p5": t5,
        "window": rng.choice([120, 300, 500]),
        "patience": rng.choice([300, 600, 1000]),
    }
    hosts = {"algo-1": {"cores": 2, "gpus": 1, "timeline": [{"gpu_util": util}]}}
    return params, hosts, kind in ("under", "fluctuating"), params["patience"] + params["window"]


def batch_size_case(rng, n: int):
    limits = {
        k: rng.choice([50, 70])
        for k in ("cpu_threshold_p95", "gpu_threshold_p95", "gpu_memory_threshold_p95")
    }
    high = [None, "cpu", None, "gpu_util", None, "gpu_mem"][n % 6]
    values = {
        "cpu": (limits["cpu_threshold_p95"] - 15) / 100,
        "gpu_util": (limits["gpu_threshold_p95"] - 15) / 100,
        "gpu_mem": (limits["gpu_memory_threshold_p95"] - 15) / 100,
    }
    if high:
        values[high] = 0.95
    params = {**limits, "window": rng.choice([120, 500]), "patience": rng.choice([300, 1000])}
    hosts = {"algo-1": {"cores": 2, "gpus": 2, "timeline": [values]}}
    return params, hosts, high is None, max(params["patience"], params["window"])


def memory_increase_case(rng, n: int):
    increase = rng.choice([5, 10, 20])
    fires = n % 2 == 0
    jump = (increase + 10 if fires else increase - 3) / 100
    params = {
        "increase": increase,
        "window": [10, 60, 200][n % 3],
        "patience": rng.choice([300, 1000]),
    }
    at = params["patience"] * 0.5 + 180
    hosts = {
        "algo-1": {
            "cores": 2,
            "gpus": 1,
            "timeline": [{"gpu_mem": 0.3}, {"from": at, "gpu_mem": 0.3 + jump}],
        }
    }
    return params, hosts, fires, params["patience"] + 2 * params["window"] + 360


def load_balancing_case(rng, n: int):
    threshold = rng.choice([0.4, 0.5, 0.6])
    fires = n % 2 == 0
    # Share of busy samples of the second GPU: 0.1 -> distance 0.72, 0.85 -> 0.23.
    other = _cycle(0.1 if fires else 0.85, 0.95, 0.3)
    params = {"threshold": threshold, "patience": rng.choice([300, 1000])}
    hosts = {"algo-1": {"cores": 2, "gpus": 2, "timeline": [{"gpu_util": [0.95, other]}]}}
    return params, hosts, fires, params["patience"]


def step_outlier_case(rng, n: int):
    stddev, n_outliers = rng.choice([2, 3, 4]), rng.choice([5, 10, 20])
    fires = n % 2 == 0
    slow = n_outliers + 6 if fires else max(n_outliers - 4, 0)
    steps, t = [], START + 30
    slow_at = set(rng.sample(range(120, 400), slow))
    for k in range(400):
        d = 3.0 if k in slow_at else 0.4 + rng.uniform(-0.02, 0.02)
        steps.append(("train", t, t + d))
        t += d
    params = {"stddev": stddev, "n_outliers": n_outliers}
    return params, {"steps": steps}, fires, 0


GENERATORS = {
    "CPUBottleneck": lambda rng, n: bottleneck_case(rng, n, io=False),
    "IOBottleneck": lambda rng, n: bottleneck_case(rng, n, io=True),
    "LowGPUUtilization": low_gpu_case,
    "BatchSize": batch_size_case,
    "GPUMemoryIncrease": memory_increase_case,
    "LoadBalancing": load_balancing_case,
    "StepOutlier": step_outlier_case,
}


def _cases():
    rng = random.Random(20261122)
    for rule, make in GENERATORS.items():
        for n in range(6):
            yield pytest.param(rule, *make(rng, n), id=f"{rule}-{n}")


@pytest.mark.parametrize("scrape", SCRAPES, ids=lambda s: f"{s:g}s")
@pytest.mark.parametrize("rule, params, hosts, fires, datapoints", list(_cases()))
def test_replay_agrees_with_the_original_rule(
    rule, params, hosts, fires, datapoints, scrape, tmp_path, promtool
):
    interval = 0.5
    # Long enough for `for:` of patience after the window filled, at a 60 s scrape.
    duration = datapoints * interval + 6 * 60
    out = tmp_path / "job" / "profiler-output"
    if "steps" in hosts:
        write_steps(str(out), "algo-1", 0, hosts["steps"])
        hosts = {"algo-1": {"cores": 2, "gpus": 1}}
    write_system(str(out), start=START, duration=duration, interval=interval, hosts=hosts)
    timeline, _ = load_timeline(str(tmp_path / "job"), "sagemaker", None)
    full = {**load_config({"rules": [rule]}).rule(rule).values, **params}
    evidence = timeline.steps if rule == "StepOutlier" else timeline.hosts
    assert DECIDE[rule](evidence, full) == fires, "the generated case is not clear-cut"
    config = {"rules": [{"rule": rule, "parameters": params}]}
    result = replay(
        str(tmp_path / "job"),
        load_config({**config, "scrape_interval": f"{scrape:g}s"}),
        scrape_interval=scrape,
    )
    assert result.rules[rule].fired == fires, f"{rule} {params} at {scrape:g}s scrapes"

"""The report's system usage statistics, job phase split and sizing advice."""

from __future__ import annotations

import pytest

from trainprof.replay.synthetic import write_steps, write_system
from trainprof.report import build, from_replay
from trainprof.report.usage import stats

START = 1_700_000_000


@pytest.fixture(scope="module")
def report(tmp_path_factory, promtool):
    out = tmp_path_factory.mktemp("usage") / "job" / "profiler-output"
    hosts = {
        "algo-1": {
            "cores": 2,
            "gpus": 2,
            "timeline": [
                {
                    "gpu_util": [0.03, {"cycle": [0.2, 0.6, 0.9]}],
                    "cpu": [0.97, 0.3],
                    "mem": 0.95,
                    "gpu_mem": 0.4,
                }
            ],
        }
    }
    write_system(str(out), start=START, duration=20 * 60, interval=0.5, hosts=hosts)
    # Steps from minute 3 to minute 15 (the job ran 20 minutes).
    steps = [("train", START + 180 + i * 1.0, START + 180 + i * 1.0 + 0.9) for i in range(720)]
    write_steps(str(out), "algo-1", 0, steps)
    collected = from_replay(str(out.parent), None, scrape_interval=15)
    return collected, build(collected)


def _table(report, caption):
    for section in report.sections:
        for table in section.tables:
            if table.caption.startswith(caption):
                return table
    raise AssertionError(f"no table {caption!r}")


def test_min_max_and_p90_beside_p50_p95_p99_per_node_and_per_gpu(report):
    _, built = report
    table = _table(built, "Overall system usage")
    assert table.columns == ["Node", "Resource", "min", "p50", "p90", "p95", "p99", "max"]
    rows = {(r[0], r[1]): r[2:] for r in table.rows}
    assert {"GPU 0 utilization", "GPU 1 utilization", "GPU 0 memory"} <= {k[1] for k in rows}
    idle = rows[("algo-1", "GPU 0 utilization")]
    assert idle[-1] == "5%"  # max to the bucket: 3 % lies in (2 %, 5 %]
    busy = rows[("algo-1", "GPU 1 utilization")]
    assert busy[0] == "15%" and busy[-1] == "90%"  # 20 % in (15 %, 20 %], 90 % in (85 %, 90 %]


def test_the_percentiles_are_the_ones_prometheus_computes(report):
    """The report's own quantiles agree with OverallSystemUsage's recordings, which
    Prometheus' histogram_quantile computed from the same buckets."""
    collected, _ = report
    from trainprof.report.usage import group

    ours = {}
    for (node, _, resource), buckets in group(collected.results["usage.node_buckets"]).items():
        ours[(node, resource)] = stats(buckets)
    compared = 0
    for q in ("p50", "p95", "p99"):
        for labels, points in collected.results[f"system.{q}"]:
            key = (labels["node"], labels["resource"])
            assert ours[key][q] == pytest.approx(points[-1][1], abs=1e-9), (key, q)
            compared += 1
    assert compared >= 12


def test_initialization_training_loop_and_finalization(report):
    _, built = report
    facts = dict(built.sections[0].facts)
    assert facts["Initialization"].startswith("3 min")
    assert facts["Training loop"].startswith("11 min 59 s") or facts["Training loop"].startswith(
        "12 min"
    )
    assert facts["Finalization"].startswith("5 min")
    assert facts["Start"].startswith("2023-11-14")  # the job's real start, not promtool's 0


def test_sizing_advice_where_the_rules_gave_it(report):
    _, built = report
    advice = dict(built.sections[0].facts)["Sizing advice"]
    assert "smaller instance type" in advice  # LowGPUUtilization fired on GPU 0
    assert "more CPU cores per GPU" in advice  # CPUBottleneck fired
    assert "Host memory reached 95" in advice and "more memory" in advice

"""`trainprof report --prometheus` on a job whose training has ended while its exporter goes
on (as a finished job's exporter does until the node is released): a real Prometheus,
a real exporter and a real training rank, stopped.

- The rank's series are stale at the report's end: rule statuses still count the steps and
  ranks seen over the range (MaxInitializationTime is quiet, not "no training process
  recorded"), and the summary reads the training's series as they were last scraped.
"""

from __future__ import annotations

import time

import pytest

from trainprof.report import build, from_prometheus
from trainprof.rules.config import load_config

from live_job import one_rank_job, scrape_config
from servers import prometheus, query, wait_for_targets

JOB = "ended-job"
RULES = {
    "scrape_interval": "1s",
    "rules": [
        {
            "rule": "MaxInitializationTime",
            "parameters": {"threshold": 20, "scan_interval_us": 10**6},
        },
        {"rule": "StepOutlier", "parameters": {"n_outliers": 2, "scan_interval_us": 10**6}},
        {"rule": "LowGPUUtilization", "parameters": {"patience": 4, "window": 10}},
        {"rule": "StalledTrainingRule", "parameters": {"threshold": 30}},
    ],
}


def _value(base: str, expr: str) -> float | None:
    result = query(base, expr)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def _until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not {what} after {timeout:g}s")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def ended_job(prometheus_bin, tmp_path_factory):
    """(Prometheus URL, the job, its rule configuration) once the rank has ended and
    Prometheus has seen its target go down."""
    from trainprof.generation.render import to_yaml
    from trainprof.rules.compiler import compile_rules

    config = load_config(RULES)
    rules = to_yaml({"groups": compile_rules(config).groups})
    workdir = tmp_path_factory.mktemp("ended-prometheus")
    with one_rank_job(JOB) as (job, rank):
        with prometheus(prometheus_bin, workdir, scrape_config(job), {"rules.yaml": rules}) as base:
            wait_for_targets(base, 2)
            steps = f'sum(trainprof_training_steps_total{{training_job="{JOB}"}})'
            scrapes = f'count_over_time(trainprof_training_steps_total{{training_job="{JOB}"}}[1m])'
            _until(lambda: (_value(base, scrapes) or 0) >= 8, "the rank scraped 8 times")
            rank.terminate()
            rank.wait(timeout=30)
            _until(
                lambda: _value(base, steps) is None,
                "the rank's series stale after it ended",
            )
            time.sleep(3)  # the exporter goes on sampling after training ended
            yield base, job, config


def test_statuses_count_the_ranks_and_steps_seen_before_training_ended(ended_job):
    base, job, config = ended_job
    collected = from_prometheus(base, job.training_job, config)
    steps = _value(
        base, f'max_over_time(sum(trainprof_training_steps_total{{training_job="{JOB}"}})[5m:1s])'
    )
    init = collected.verdicts["MaxInitializationTime"].status
    assert init.status == "quiet", init.reason
    assert init.datapoints == steps  # every step the rank took
    outlier = collected.verdicts["StepOutlier"].status
    assert outlier.status in ("quiet", "fired") and outlier.datapoints == steps


def test_the_summary_reads_the_training_as_it_was_last_scraped(ended_job):
    base, job, config = ended_job
    built = build(from_prometheus(base, job.training_job, config))
    facts = dict(built.sections[0].facts)
    steps = _value(
        base, f'max_over_time(sum(trainprof_training_steps_total{{training_job="{JOB}"}})[5m:1s])'
    )
    assert facts["Steps"] == f"train: {steps:.0f}" and facts["Ranks"] == "1"
    assert "Initialization" in facts and "Training loop" in facts
    framework = next(s for s in built.sections if s.title == "Framework metrics summary")
    assert not framework.empty and framework.charts

"""`trainprof report --prometheus` on a job whose training has ended while its exporter goes
on (as a finished job's exporter does until the node is released): a real Prometheus,
a real exporter and a real training rank, stopped.

- The rank's series are stale at the report's end: rule statuses still count the steps and
  ranks seen over the range (MaxInitializationTime is quiet, not "no training process
  recorded"), and the summary reads the training's series as they were last scraped.
- Without `--rules`, the report judges the trainprof rules Prometheus loaded (their `rule`
  and `trainprof_rule_version` labels in /api/v1/rules), with the parameters Prometheus
  evaluates, not SageMaker's default ProfilerReport.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from trainprof.report import build, from_prometheus
from trainprof.rules.config import default_config, load_config

from live_job import one_rank_job, scrape_config
from servers import get_json, prometheus, query, wait_for_firing, wait_for_targets

JOB = "ended-job"
RULES = {
    "scrape_interval": "1s",
    "rules": [
        {
            "rule": "MaxInitializationTime",
            "parameters": {"threshold": 15, "scan_interval_us": 10**6},
        },
        {"rule": "StepOutlier", "parameters": {"n_outliers": 2, "scan_interval_us": 10**6}},
        # The node's GPU runs at 85 %: quiet at SageMaker's 70, firing at 90.
        {
            "rule": "LowGPUUtilization",
            "parameters": {
                "threshold_p95": 90,
                "patience": 4,
                "window": 10,
                "scan_interval_us": 10**6,
            },
        },
        {"rule": "StalledTrainingRule", "parameters": {"threshold": 30}},
        {"rule": "GPUMemoryIncrease"},  # at its defaults
    ],
}
LOADED = [
    "GPUMemoryIncrease",
    "LowGPUUtilization",
    "MaxInitializationTime",
    "StalledTrainingRule",
    "StepOutlier",
]


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
            wait_for_firing(base, {"LowGPUUtilization"})
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


def report(base: str, tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    out = tmp_path / "r.html"
    result = subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "report", "--prometheus", base, "--job", JOB]
        + ["--scrape-interval", "1s", "-o", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result, out.read_text()


def test_without_rules_the_report_judges_the_rules_prometheus_loaded(ended_job, tmp_path):
    base, job, config = ended_job
    seen = {
        rule["labels"]["rule"]
        for group in get_json(f"{base}/api/v1/rules")["data"]["groups"]
        for rule in group["rules"]
        if "trainprof_rule_version" in rule.get("labels", {})
    }
    assert set(LOADED) <= seen
    result, page = report(base, tmp_path)
    assert f"the 5 trainprof rules Prometheus evaluates ({', '.join(LOADED)})" in result.stderr
    # every parameter changed but GPUMemoryIncrease's
    assert (
        "LowGPUUtilization, MaxInitializationTime, StalledTrainingRule, StepOutlier: Prometheus "
        "evaluates other parameters than the defaults" in result.stderr
    )
    assert "TrainprofState" not in result.stderr  # trainprof's own alerts are not rules
    for name in LOADED:
        assert name in page, name
    assert re.search(r"\d+ of 5 rules fired", result.stderr), result.stderr
    # LowGPUUtilization fires at the threshold Prometheus evaluates (90 %; 70 % by default)
    collected = from_prometheus(base, job.training_job, default_config(1.0), loaded=True)
    assert set(collected.verdicts) == set(LOADED)
    assert collected.verdicts["LowGPUUtilization"].fired


def test_rules_given_are_judged_as_given(ended_job, tmp_path):
    base, _, _ = ended_job
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules: [{rule: CPUBottleneck}, {rule: StepOutlier}]\n")
    result, page = report(base, tmp_path, "--rules", str(rules))
    assert "Prometheus evaluates" not in result.stderr
    assert re.search(r"\d+ of 2 rules fired", result.stderr), result.stderr
    assert "CPUBottleneck" in page


def test_a_prometheus_without_trainprof_rules_falls_back_to_profiler_report(
    prometheus_bin, tmp_path
):
    with prometheus(prometheus_bin, tmp_path, "global: {scrape_interval: 1s}\n", {}) as base:
        collected_notes: list[str] = []
        config, groups = _loaded_rules_of(base, collected_notes)
    assert groups is None and config.rule("CPUBottleneck") is not None
    assert collected_notes == [
        "Prometheus evaluates no trainprof rules: the report judges SageMaker's default "
        "ProfilerReport (--rules FILE names another)"
    ]


def _loaded_rules_of(base: str, notes: list[str]):
    from trainprof.engines.prometheus_api import PrometheusAPI
    from trainprof.report.collect import _loaded_rules

    return _loaded_rules(PrometheusAPI(base), default_config(1.0), notes)

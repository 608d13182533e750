"""gpu_attribution: which alerts are joined to the GPU's job, and how the setting is read.
The verdicts themselves run through promtool in tests/scenarios/GPUAttribution.yaml."""

from __future__ import annotations

import pytest
import yaml

from trainprof.deploy.chart import chart_config, helm_values
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import ConfigError, load_config


def _alerts(groups) -> dict[str, list[str]]:
    """Each alert's condition: the `affected` recording written for it in its group (one
    per alert, in the alerts' order; the alert counts it per job)."""
    out: dict[str, list[str]] = {}
    for g in groups:
        if g["name"] == "trainprof.state":
            continue  # job states are no rule's verdict: not recorded
        conditions = [r["expr"] for r in g["rules"] if r.get("record", "").endswith(":affected")]
        alerts = [r["alert"] for r in g["rules"] if "alert" in r]
        assert len(conditions) == len(alerts), g["name"]
        for name, condition in zip(alerts, conditions):
            out.setdefault(name, []).append(condition)
    return out


def test_auto_and_exporter_compile_the_same_rules():
    auto = compile_rules(load_config({"rules": [{"rule": "ProfilerReport"}]})).groups
    exporter = compile_rules(
        load_config({"gpu_attribution": "exporter", "rules": [{"rule": "ProfilerReport"}]})
    ).groups
    assert auto == exporter
    assert "trainprof_gpu_assignment_info" not in yaml.safe_dump(auto)


def test_assignment_joins_exactly_the_per_gpu_alerts():
    config = load_config({"gpu_attribution": "assignment", "rules": [{"rule": "ProfilerReport"}]})
    plain = _alerts(compile_rules(load_config({"rules": [{"rule": "ProfilerReport"}]})).groups)
    joined = _alerts(compile_rules(config).groups)
    changed = {name for name in plain if plain[name] != joined[name]}
    assert changed == {
        "TrainingLowGPUUtilization",
        "TrainingBatchSize",
        "TrainingGPUMemoryIncrease",
        "TrainingLoadBalancing",
    }
    for name in changed:
        for before, after in zip(plain[name], joined[name]):
            assert after.startswith("(\n") and before.splitlines()[0] in after
            assert "* on (uuid) group_left (namespace, training_job)" in after
    assert set(joined) - set(plain) == {"TrainprofGPUSharedByJobs"}


def test_the_join_uses_the_configured_job_labels_and_selector():
    config = load_config(
        {
            "gpu_attribution": "assignment",
            "job_labels": ["cluster", "training_job"],
            "job_selector": {"cluster": "eu-1"},
            "rules": [{"rule": "LowGPUUtilization"}],
        }
    )
    (expr, *_) = _alerts(compile_rules(config).groups)["TrainingLowGPUUtilization"]
    assert "group_left (cluster, training_job)" in expr
    assert 'trainprof_gpu_assignment_info{cluster="eu-1"}' in expr


def test_without_gpu_rules_there_is_no_shared_gpu_alert():
    config = load_config({"gpu_attribution": "assignment", "rules": [{"rule": "CPUBottleneck"}]})
    assert "TrainprofGPUSharedByJobs" not in _alerts(compile_rules(config).groups)


def test_a_misspelled_mode_is_reported_with_the_nearest_one():
    with pytest.raises(ConfigError) as e:
        load_config({"gpu_attribution": "asignment", "rules": [{"rule": "LowGPUUtilization"}]})
    text = str(e.value)
    assert "gpu_attribution" in text and "did you mean assignment?" in text


def test_the_chart_assigns_unless_told_otherwise():
    auto = load_config({"rules": [{"rule": "LowGPUUtilization"}]})
    assert chart_config(auto).gpu_attribution == "assignment"
    told = load_config({"gpu_attribution": "exporter", "rules": [{"rule": "LowGPUUtilization"}]})
    assert chart_config(told) is told
    values = yaml.safe_load(helm_values(compile_rules(auto), "test"))
    assert "trainprof_gpu_assignment_info" in yaml.safe_dump(values)
    values = yaml.safe_load(helm_values(compile_rules(told), "test"))
    assert "trainprof_gpu_assignment_info" not in yaml.safe_dump(values)

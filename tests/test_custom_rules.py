"""Custom rules written in the configuration: checked, compiled, routed, drawn and replayed
like the built-in ones."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import yaml

from test_alerting import amtool_routes
from trainprof.alerting import files, routing
from trainprof.dashboards import iter_panels, job, panels
from trainprof.generation.render import to_yaml
from trainprof.replay.tensors import replay_trial
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import ConfigError, load_config

from smdebug_writer import write_trial

SLOW_MEAN_STEP = {
    "custom": "SlowMeanStep",
    "expr": "max by (training_job) (rate(trainprof_training_step_duration_seconds_sum[5m]) "
    "/ rate(trainprof_training_step_duration_seconds_count[5m])) > {threshold}",
    "parameters": {"threshold": 20},
    "severity": "warning",
    "description": "Mean step time above {threshold} s.",
    "recommendation": "Look at the slowest phase.",
}
GRADIENT_TOO_LARGE = {
    "custom": "GradientTooLarge",
    "expr": 'max by (training_job) (trainprof_tensor_mean_abs{collection="gradients", '
    'aggregate="max"}) > {threshold}',
    "parameters": {"threshold": 20},
    "actions": ["StopTraining"],
}


def _alert(config, name):
    return next(
        r
        for g in compile_rules(config).groups
        for r in g["rules"]
        if r.get("labels", {}).get("rule") == name and "alert" in r
    )


def _condition(config, name) -> str:
    """The rule's condition as written: its `affected` recording, which the alert counts."""
    return next(
        r["expr"]
        for g in compile_rules(config).groups
        for r in g["rules"]
        if r.get("labels", {}).get("rule") == name and r.get("record", "").endswith(":affected")
    )


def test_the_issues_example_compiles_and_promtool_accepts_it(promtool, tmp_path):
    config = load_config({"rules": [SLOW_MEAN_STEP]})
    alert = _alert(config, "SlowMeanStep")
    assert alert["alert"] == "TrainingSlowMeanStep"
    assert _condition(config, "SlowMeanStep").endswith(") > 20")
    assert alert["annotations"]["description"] == "Mean step time above 20 s."
    assert alert["annotations"]["recommendation"] == "Look at the slowest phase."
    path = tmp_path / "rules.yaml"
    path.write_text(to_yaml({"groups": compile_rules(config).groups}))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_parameters_are_overridden_like_any_rules(promtool):
    config = load_config(
        {
            "rules": [
                SLOW_MEAN_STEP,
                {"rule": "SlowMeanStep", "parameters": {"threshold": "30"}},
            ]
        }
    )
    alert = _alert(config, "SlowMeanStep")
    assert _condition(config, "SlowMeanStep").endswith(") > 30")
    assert alert["annotations"]["description"] == "Mean step time above 30 s."


def test_window_and_patience_translate_like_the_built_in_rules(promtool):
    config = load_config(
        {
            "datapoint_interval": "0.5s",
            "rules": [
                {
                    "custom": "Busy",
                    "expr": "avg_over_time(trainprof_tensor_zero_ratio[{window}]) > {limit}",
                    "parameters": {"limit": 0.5},
                    "window": 240,
                    "patience": 120,
                }
            ],
        }
    )
    alert = _alert(config, "Busy")
    assert "[2m]" in _condition(config, "Busy") and alert["for"] == "1m"


def test_every_problem_is_reported_at_once_with_its_path(promtool):
    with pytest.raises(ConfigError) as e:
        load_config(
            {
                "rules": [
                    {**SLOW_MEAN_STEP, "expr": "max by (training_job) (rate(x[5m]) > {threshold}"},
                    {**GRADIENT_TOO_LARGE, "expr": "up > {treshold}"},
                    {"custom": "LossNotDecreasing", "expr": "up > 1"},
                    {"custom": "Fine", "expr": "up > 1", "severity": "loud"},
                ]
            }
        )
    text = str(e.value)
    assert "rules[0].expr: not valid PromQL: " in text and "unclosed left parenthesis" in text
    assert "rules[1].expr: {treshold} is not a parameter (did you mean threshold?)" in text
    assert "rules[2].custom: LossNotDecreasing is a built-in rule" in text
    assert "rules[3].severity: 'loud' is not one of info, warning, critical" in text


def test_a_custom_rule_replays_from_a_trial_with_its_first_fired_step(promtool, tmp_path):
    g = np.full(8, 0.5, dtype=np.float32)
    steps = {0: {"gradient/fc.weight": g}, 5: {"gradient/fc.weight": g * 100}}
    root = write_trial(tmp_path / "trial", steps)
    verdict = replay_trial(str(root), load_config({"rules": [GRADIENT_TOO_LARGE]}))
    assert verdict.rules["GradientTooLarge"].first_fired_step == 5
    assert verdict.rules["GradientTooLarge"].alerts[0].labels["action"] == "stop"


def test_custom_alerts_are_routed_like_the_catalogs(amtool, tmp_path):
    tree, inhibit = files._parts()
    path = tmp_path / "alertmanager.yml"
    path.write_text(
        yaml.safe_dump(files.example_config(tree, inhibit, files.placeholder_receivers()))
    )
    labels = {
        "alertname": "TrainingGradientTooLarge",
        "rule": "GradientTooLarge",
        "trainprof_rule_version": "1",
        "namespace": "ml",
        "training_job": "bert",
    }
    amtool_routes(amtool, path, {**labels, "severity": "critical"}, [routing.ACTIONS, routing.PAGE])


def test_the_job_dashboard_draws_it_against_its_threshold(promtool):
    # the job dashboard reads the summary rules: ProfilerReport, as SageMaker attached it
    rules = [{"rule": "ProfilerReport"}, GRADIENT_TOO_LARGE, {"rule": "LossNotDecreasing"}]
    config = load_config({"rules": rules})
    data = json.loads(panels.render(job.dashboard(config)))
    row = next(p for p in data["panels"] if p["title"].startswith("GradientTooLarge"))
    (chart,) = [p for p in iter_panels({"panels": row["panels"]}) if p["type"] == "timeseries"]
    assert chart["targets"][0]["expr"].startswith("max by (training_job) (trainprof_tensor_mean")
    assert 20 in [s["value"] for s in chart["fieldConfig"]["defaults"]["thresholds"]["steps"]]
    assert any(p["title"].startswith("LossNotDecreasing") for p in data["panels"])


def test_the_report_lists_tensor_and_custom_rules_in_its_rule_summary(promtool, tmp_path):
    from trainprof.replay.synthetic import write_system
    from trainprof.report import build, from_replay, render

    source = tmp_path / "job" / "profiler-output"
    write_system(
        str(source),
        start=1_700_000_000,
        duration=4 * 60,
        interval=0.5,
        hosts={"algo-1": {"cores": 2, "gpus": 1, "timeline": [{"gpu_util": 0.5}]}},
    )
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        yaml.safe_dump(
            {
                "rules": [
                    {"rule": "ProfilerReport"},
                    {"rule": "LossNotDecreasing"},
                    GRADIENT_TOO_LARGE,
                ]
            }
        )
    )
    html = render(build(from_replay(str(tmp_path / "job"), str(rules), promtool=promtool)))
    for rule in ("LossNotDecreasing", "GradientTooLarge", "LowGPUUtilization"):
        assert f'data-rule="{rule}"' in html, rule

"""One alert per job and rule: its labels, its value (units affected) and its description,
rendered by promtool's real template engine from the committed rules, and the hold that
keeps a firing alert through noise (the flapping scenarios in tests/scenarios say the rest).
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from trainprof.contract.durations import parse_duration
from trainprof.generation.render import to_yaml
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config

from scenario import DEFAULT_RULES, scraped_series

# 2 nodes x 2 GPUs: one idle GPU (every sample at or below 70%), one idle but for one
# sample in 40 (97.5%), two busy. Evaluated at 12m, past the 8m20s patience.
FOUR_GPUS = {
    "name": "two of four GPUs idle",
    "duration": "12m",
    "hosts": {
        "n1": {"gpus": 2, "timeline": [{"gpu_util": [0.9, 0.02]}]},
        "n2": {"gpus": 2, "timeline": [{"gpu_util": [{"cycle": [0.02] * 39 + [0.9]}, 0.95]}]},
    },
}


DASHBOARD = (
    "http://localhost:3000/d/trainprof-job/trainprof-job?var-training_job=bert&var-namespace=ml"
)


def _rule(groups, alertname, reason=None):
    for group in groups:
        for rule in group["rules"]:
            if rule.get("alert") == alertname and rule["labels"].get("reason") == reason:
                return rule
    raise KeyError(alertname)


def _promtool(promtool, tmp_path, groups, series, tests) -> subprocess.CompletedProcess:
    (tmp_path / "rules.yaml").write_text(to_yaml({"groups": groups}))
    doc = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "15s", "input_series": series, **tests}],
    }
    (tmp_path / "test.yaml").write_text(to_yaml(doc))
    return subprocess.run(
        [promtool, "test", "rules", "test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_one_alert_for_the_job_says_how_many_gpus_of_how_many_and_names_the_worst(
    promtool, tmp_path
):
    groups = yaml.safe_load(DEFAULT_RULES.read_text())["groups"]
    rule = _rule(groups, "TrainingLowGPUUtilization", "underutilized")
    annotations = {**rule["annotations"], "dashboard_url": DASHBOARD}
    # Written out by hand: what a person reads, not what the template code produces.
    annotations["description"] = (
        "Job bert: 2 of 4 GPUs were underutilized over the last 4m10s: their 95th percentile "
        "utilization was below 70%. Worst (share of samples at or below 70%): n1 GPU 1 at "
        "100%, n2 GPU 0 at 97.5%."
    )
    done = _promtool(
        promtool,
        tmp_path,
        groups,
        scraped_series(FOUR_GPUS, 0.5),
        {
            "alert_rule_test": [
                {
                    "eval_time": "12m",
                    "alertname": "TrainingLowGPUUtilization",
                    "exp_alerts": [
                        {
                            # the job and the rule, no GPU, node or value in the labels
                            "exp_labels": {
                                "namespace": "ml",
                                "training_job": "bert",
                                "rule": "LowGPUUtilization",
                                "severity": "warning",
                                "reason": "underutilized",
                                "trainprof_rule_version": "1",
                            },
                            "exp_annotations": annotations,
                        }
                    ],
                }
            ],
            # the alert's value: the GPUs affected
            "promql_expr_test": [
                {
                    "expr": 'ALERTS_FOR_STATE{alertname="TrainingLowGPUUtilization"} * 0 + 1',
                    "eval_time": "12m",
                    "exp_samples": [
                        {
                            "labels": '{namespace="ml", training_job="bert", '
                            'rule="LowGPUUtilization", severity="warning", '
                            'reason="underutilized", trainprof_rule_version="1", '
                            'alertname="TrainingLowGPUUtilization"}',
                            "value": 1,
                        }
                    ],
                },
            ],
        },
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_alert_value_is_the_number_of_units_affected(promtool, tmp_path):
    groups = yaml.safe_load(DEFAULT_RULES.read_text())["groups"]
    rule = _rule(groups, "TrainingLowGPUUtilization", "underutilized")
    done = _promtool(
        promtool,
        tmp_path,
        groups,
        scraped_series(FOUR_GPUS, 0.5),
        {
            "promql_expr_test": [
                {
                    "expr": rule["expr"],
                    "eval_time": "12m",
                    "exp_samples": [
                        {"labels": '{namespace="ml", training_job="bert"}', "value": 2}
                    ],
                }
            ]
        },
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_held_alert_still_names_what_it_found_within_the_hold(promtool, tmp_path):
    """Busy again for 3 minutes, within the 8m20s hold: the alert still fires, and its
    description still counts and names the GPU it found then."""
    groups = compile_rules(
        load_config({"rules": [{"rule": "LowGPUUtilization", "parameters": {"window": "60"}}]})
    ).groups
    rule = _rule(groups, "TrainingLowGPUUtilization", "underutilized")
    # Idle for 10 minutes (fires at 10m), busy from 10m: held until 10m + 8m20s.
    case = {
        "duration": "13m",
        "hosts": {
            "n1": {"gpus": 1, "timeline": [{"gpu_util": 0.02}, {"from": "10m", "gpu_util": 0.9}]}
        },
    }
    annotations = {**rule["annotations"], "dashboard_url": DASHBOARD}
    annotations["description"] = (
        "Job bert: 1 of 1 GPUs were underutilized over the last 30s: their 95th percentile "
        "utilization was below 70%. Worst (share of samples at or below 70%): n1 GPU 0 at "
        "100%."
    )
    labels = {
        "namespace": "ml",
        "training_job": "bert",
        "rule": "LowGPUUtilization",
        "severity": "warning",
        "reason": "underutilized",
        "trainprof_rule_version": "1",
    }
    done = _promtool(
        promtool,
        tmp_path,
        groups,
        scraped_series(case, 0.5),
        {
            "alert_rule_test": [
                {
                    "eval_time": "13m",
                    "alertname": "TrainingLowGPUUtilization",
                    "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations}],
                }
            ]
        },
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("source", ["trainprof", "dcgm", "dcgm,node_exporter", "node_exporter"])
def test_every_alert_of_every_rule_is_one_per_job_and_reason(source):
    """No alert keeps a unit's label: each counts (or reads) its per-job recording."""
    from trainprof.rules.catalog import registry

    every = [{"rule": "ProfilerReport"}] + [
        {"rule": r.name, "parameters": PARAMETERS.get(r.name, {})} for r in registry.TENSOR_RULES
    ]
    compiled = compile_rules(load_config({"rules": every, "source": source.split(",")}))
    by_rule = {a.rule for a in compiled.affected}
    assert by_rule >= {i.spec.name for i in compiled.alerting} | {"TrainprofHealth"}
    alerts = [r for g in compiled.groups for r in g["rules"] if "alert" in r]
    for rule in alerts:
        if rule["labels"]["rule"] == "TrainprofState":
            continue  # a job's state, one per job already
        first = rule["expr"].splitlines()[0]
        if rule["labels"].get("scope") == "cluster":
            assert first.startswith("absent("), first  # a cluster-wide input: one alert
            continue
        assert first.startswith("count by (namespace, training_job) (") or (
            first.startswith("training_job:") and first.endswith("}")
        ), (rule["alert"], first)
    for found in compiled.affected:
        # not held: counts that cannot fall back, and a rule holding in its own expression
        assert parse_duration("1m") <= found.hold or found.rule in (
            "StepOutlier",
            "MaxInitializationTime",
            "LossNotDecreasing",
        ), found


def test_stop_training_targets_the_job_from_every_alerts_own_labels():
    """StopTraining decides from an alert's labels: every rule's alert carries the job and
    no unit, so the receiver stops that job (Kubernetes, dry run) and needs nothing else."""
    from trainprof.actions.config import load_actions_config
    from trainprof.actions.decide import plan
    from trainprof.actions.payload import Alert
    from trainprof.rules.catalog import registry

    every = [{"rule": "ProfilerReport"}] + [
        {"rule": r.name, "parameters": PARAMETERS.get(r.name, {}), "actions": ["StopTraining"]}
        for r in registry.TENSOR_RULES
    ]
    compiled = compile_rules(load_config({"rules": every}))
    actions = load_actions_config(
        {
            "token_env": "UNUSED",
            "allow": {"namespaces": ["team-a"], "training_jobs": ["bert-.*"]},
            "rules": {r.name: "stop" for r in registry.PROFILER_RULES if r.alerting},
            "kubernetes": {"resource": "Job"},
        }
    )
    rules = [r for g in compiled.groups for r in g["rules"] if "alert" in r]
    assert len(rules) > 30
    unit_labels = {"gpu", "node", "uuid", "rank", "mode", "collection", "instance", "peer_gpu"}
    for rule in rules:
        if rule["labels"]["rule"] in ("TrainprofHealth", "TrainprofState"):
            continue
        assert not unit_labels & set(rule["labels"]), rule["alert"]
        labels = {"alertname": rule["alert"], **rule["labels"]}
        labels |= {"namespace": "team-a", "training_job": "bert-large"}
        decided = plan(actions, Alert("firing", labels, "2026-01-01T00:00:00Z", "f"))
        assert (decided.decision, decided.target) == ("stop", "Job team-a/bert-large"), labels


PARAMETERS = {"TensorVariance": {"max_threshold": "10"}, "SimilarAcrossRuns": {"other_trials": "a"}}

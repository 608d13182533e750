"""Pasted SageMaker SDK code with tensor rules and actions: compiled with no warning, the
actions carried to the alerts, routed by the real amtool and honoured by StopTraining."""

from __future__ import annotations

import pytest
import yaml

from test_alerting import amtool_routes
from trainprof.actions.config import load_actions_config
from trainprof.actions.decide import plan
from trainprof.actions.payload import Alert
from trainprof.alerting import files, routing
from trainprof.contract.names import INPUT_MISSING_ALERT
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config
from trainprof.rules.sdk import Rule, extract, rule_configs, to_config

ESTIMATOR = """
from sagemaker.debugger import Rule, rule_configs, CollectionConfig

actions = rule_configs.ActionList(
    rule_configs.StopTraining(), rule_configs.Email("ml@example.com"), rule_configs.SMS("+1555")
)
rules = [
    Rule.sagemaker(rule_configs.loss_not_decreasing(),
                   rule_parameters={"num_steps": "10", "diff_percent": "0"}, actions=actions),
    Rule.sagemaker(rule_configs.vanishing_gradient(),
                   collections_to_save=[CollectionConfig(name="gradients",
                                                         parameters={"save_interval": "500"})]),
    Rule.sagemaker(rule_configs.stalled_training_rule(),
                   rule_parameters={"threshold": "120"}, actions=rule_configs.StopTraining()),
    Rule.sagemaker(rule_configs.nlp_sequence_ratio()),
    Rule.sagemaker(rule_configs.class_imbalance(), actions=rule_configs.Email("x@y")),
]
"""


def _alerts(config):
    return {
        r["labels"]["rule"]: r
        for g in compile_rules(config).groups
        for r in g["rules"]
        if "alert" in r and r["alert"] != INPUT_MISSING_ALERT
    }


def test_pasted_tensor_rules_with_actions_compile_without_warning():
    found = extract(ESTIMATOR, "estimator.py")
    assert found.problems == [] and found.warnings == []
    config = load_config(found.config)
    assert config.warnings == ()
    compiled = compile_rules(config)
    assert compiled.warnings == ()
    alerts = _alerts(config)
    assert set(alerts) == {
        "LossNotDecreasing",
        "VanishingGradient",
        "StalledTrainingRule",
        "NLPSequenceRatio",
        "ClassImbalance",
    }
    assert alerts["LossNotDecreasing"]["labels"]["action"] == "stop"
    assert alerts["LossNotDecreasing"]["labels"]["notify"] == "email,sms"
    assert alerts["StalledTrainingRule"]["labels"]["action"] == "stop"
    assert alerts["ClassImbalance"]["labels"]["notify"] == "email"
    assert "action" not in alerts["VanishingGradient"]["labels"]


def test_the_python_stand_ins_carry_actions_too():
    rule = Rule.sagemaker(
        rule_configs.overfit(),
        rule_parameters={"ratio_threshold": "0.2"},
        actions=rule_configs.ActionList(rule_configs.StopTraining(), rule_configs.SMS("+1")),
    )
    assert to_config([rule]) == {
        "rules": [
            {
                "rule": "Overfit",
                "parameters": {"ratio_threshold": "0.2"},
                "actions": ["StopTraining", "SMS"],
            }
        ]
    }


def test_unknown_actions_rules_and_missing_parameters_are_clear_problems():
    with pytest.raises(Exception) as e:
        load_config({"rules": [{"rule": "Overfit", "actions": ["StopTrainning"]}]})
    assert "rules[0].actions[0]" in str(e.value) and "StopTraining" in str(e.value)
    with pytest.raises(Exception) as e:
        load_config({"rules": [{"rule": "LossNotDecreasng"}]})
    assert "unknown rule 'LossNotDecreasng' (did you mean LossNotDecreasing?)" in str(e.value)
    with pytest.raises(Exception) as e:
        load_config({"rules": [{"rule": "SimilarAcrossRuns"}]})
    assert "rules[0].parameters.other_trials: SimilarAcrossRuns needs other_trials" in str(e.value)


def test_stop_training_receiver_acts_on_the_action_label_within_its_allow_list():
    config = load_actions_config(
        {
            "token_env": "UNUSED",
            "allow": {"namespaces": ["team-a"], "training_jobs": ["bert-.*"]},
            "rules": {"CPUBottleneck": "stop", "Overfit": "notify"},
            "kubernetes": {"resource": "Job", "action": "suspend"},
        }
    )

    def alert(**labels):
        base = {"namespace": "team-a", "training_job": "bert-large"}
        return Alert("firing", {**base, **labels}, "2026-11-23T00:00:00Z", "f")

    assert plan(config, alert(rule="LossNotDecreasing", action="stop")).decision == "stop"
    assert plan(config, alert(rule="LossNotDecreasing")).decision == "ignored"
    # the receiver's configuration still decides: a notify rule stays notify
    assert plan(config, alert(rule="Overfit", action="stop")).decision == "notify"
    outside = alert(rule="LossNotDecreasing", action="stop", training_job="gpt-x")
    assert plan(config, outside).decision == "ignored"


def test_email_and_sms_actions_reach_the_notify_and_page_receivers(amtool, tmp_path):
    tree, inhibit = files._parts()
    path = tmp_path / "alertmanager.yml"
    path.write_text(
        yaml.safe_dump(files.example_config(tree, inhibit, files.placeholder_receivers()))
    )
    job = {"namespace": "ml", "training_job": "bert"}
    labels = {"alertname": "TrainingLossNotDecreasing", "rule": "LossNotDecreasing", **job}
    amtool_routes(
        amtool,
        path,
        {**labels, "severity": "warning", "notify": "email,sms", "action": "stop"},
        [routing.ACTIONS, routing.PAGE, routing.NOTIFY, routing.NOTIFY],
    )
    amtool_routes(amtool, path, {**labels, "severity": "info"}, [routing.ACTIONS, routing.INFO])


COLLECTIONS = """
from sagemaker.debugger import Rule, rule_configs, CollectionConfig

rules = [
    Rule.sagemaker(
        base_config=rule_configs.check_input_images(),
        rule_parameters={"threshold_mean": "0.5", "threshold_samples": "8"},
        collections_to_save=[
            CollectionConfig(
                name="custom_inputs_include_collection",
                parameters={"include_regex": ".*Net_input_0", "save_interval": "500"},
            )
        ],
    ),
    Rule.sagemaker(
        rule_configs.nlp_sequence_ratio(),
        rule_parameters={"tokens_regex": ".*embedding0_input_0"},
        collections_to_save=[CollectionConfig(name="input_sequence",
                                              parameters={"include_regex": ".*bert_input_0"})],
    ),
]
"""


def test_collection_config_names_the_inputs_a_rule_judges(promtool, tmp_path):
    """The CollectionConfig saving a job's inputs decides which tensors CheckInputImages reads:
    a trial written by smdebug whose images are named as the job named them fires."""
    from pathlib import Path

    from trainprof.replay.tensors import replay_trial

    found = extract(COLLECTIONS, "estimator.py")
    assert found.problems == []
    rules = found.config["rules"]
    assert rules[0]["parameters"]["regex"] == ".*Net_input_0"
    assert rules[1]["parameters"]["tokens_regex"] == ".*embedding0_input_0"  # given: kept
    assert any("'.*bert_input_0'" in w and "NLPSequenceRatio" in w for w in found.warnings)
    trial = Path(__file__).parent / "data" / "smdebug-trials" / "CheckInputImages"
    config = load_config({"rules": rules[:1]})
    result = replay_trial(str(trial / "fire-pytorch-name-at-3"), config, promtool=promtool)
    assert result.rules["CheckInputImages"].first_fired_step == 3


def test_collections_to_save_must_be_collection_configs():
    bad = "Rule.sagemaker(rule_configs.check_input_images(), collections_to_save=['x'])"
    found = extract(bad, "estimator.py")
    assert any("CollectionConfig" in message for _, message in found.problems)

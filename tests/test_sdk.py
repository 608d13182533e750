"""Pasted SageMaker SDK code: the runtime shim and the read-without-running extractor."""

from __future__ import annotations

import pytest

from trainprof.rules.config import load_config
from trainprof.rules.sdk import ProfilerRule, extract, rule_configs, to_config

ESTIMATOR = """
from sagemaker.debugger import ProfilerRule, ProfilerConfig, Rule, rule_configs
from sagemaker.pytorch import PyTorch

report = rule_configs.ProfilerReport(CPUBottleneck_cpu_threshold=95, IOBottleneck_threshold="30")
rules = [
    ProfilerRule.sagemaker(report),
    ProfilerRule.sagemaker(rule_configs.LowGPUUtilization(),
                           rule_parameters={"threshold_p95": "60", "window": "250"}),
    ProfilerRule.sagemaker(base_config=rule_configs.StepOutlier(stddev=4),
                           actions=rule_configs.ActionList(rule_configs.StopTraining())),
    Rule.sagemaker(rule_configs.vanishing_gradient()),
]
estimator = PyTorch(
    entry_point="train.py",
    instance_type="ml.p3.8xlarge",
    profiler_config=ProfilerConfig(system_monitor_interval_millis=100),
    rules=rules,
)
"""


def test_pasted_estimator_code_becomes_a_configuration():
    found = extract(ESTIMATOR, "launch.py")
    assert found.problems == []
    assert found.config == {
        "datapoint_interval": "100ms",
        "rules": [
            {
                "rule": "ProfilerReport",
                "parameters": {"CPUBottleneck_cpu_threshold": 95, "IOBottleneck_threshold": "30"},
            },
            {"rule": "LowGPUUtilization", "parameters": {"threshold_p95": "60", "window": "250"}},
            {"rule": "StepOutlier", "parameters": {"stddev": 4}, "actions": ["StopTraining"]},
            # the SDK's snake_case tensor rules are rules too (tests/test_sdk_tensor_rules.py)
            {"rule": "VanishingGradient"},
        ],
    }
    assert found.warnings == []
    config = load_config(found.config)
    assert config.datapoint_interval == 0.1
    assert config.rule("IOBottleneck").values["threshold"] == 30
    assert config.rule("LowGPUUtilization").values["window"] == 250


def test_extracting_never_runs_the_code():
    found = extract(
        "import os\nos.system('touch /tmp/pwned')\nrules = [rule_configs.BatchSize(window=100)]\n"
    )
    assert found.config == {"rules": [{"rule": "BatchSize", "parameters": {"window": 100}}]}


def test_computed_values_are_a_problem_with_a_line_number():
    found = extract(
        "t = 60\nProfilerRule.sagemaker(rule_configs.LowGPUUtilization(),\n"
        "    rule_parameters={'threshold_p95': t})\n",
        "launch.py",
    )
    assert found.problems and found.problems[0][0] == "launch.py:3"
    assert "literal" in found.problems[0][1]


def test_code_without_rules_and_broken_code_are_problems():
    assert "no SageMaker profiler rule" in extract("x = 1\n").problems[0][1]
    assert "not valid Python" in extract("def (:\n", "a.py").problems[0][1]


def test_runtime_shim_matches_the_sdk_shapes():
    rules = [
        ProfilerRule.sagemaker(rule_configs.ProfilerReport(CPUBottleneck_cpu_threshold=90)),
        ProfilerRule.sagemaker(
            rule_configs.LowGPUUtilization(), rule_parameters={"threshold_p95": "70"}
        ),
        rule_configs.GPUMemoryIncrease(increase=10),
    ]
    config = to_config(rules, datapoint_interval="0.5s")
    assert config["rules"][2] == {"rule": "GPUMemoryIncrease", "parameters": {"increase": 10}}
    resolved = load_config(config)
    assert resolved.rule("CPUBottleneck").values["cpu_threshold"] == 90
    assert resolved.rule("GPUMemoryIncrease").values["increase"] == 10


def test_runtime_shim_rejects_unknown_parameters_like_the_sdk():
    with pytest.raises(TypeError, match="did you mean threshold_p95"):
        rule_configs.LowGPUUtilization(threshold_p96=70)

"""The rule configuration loader: one good configuration, then one mutation per bad case."""

from __future__ import annotations

import copy

import pytest

from trainprof.rules.config import ConfigError, load_config


def good() -> dict:
    return {
        "datapoint_interval": "0.5s",
        "scrape_interval": "30s",
        "patience_mode": "auto",
        "job_labels": ["namespace", "training_job"],
        "job_selector": {"namespace": "team-a", "training_job": {"regex": "bert-.*"}},
        "links": {
            "runbook_url": "https://runbooks.example.com/trainprof",
            "grafana_url": "https://grafana.example.com/",
        },
        "rules": [
            {
                "rule": "ProfilerReport",
                "parameters": {
                    "CPUBottleneck_cpu_threshold": 95,
                    "lowgpuutilization_window": "400",
                },
            },
            {
                "rule": "LowGPUUtilization",
                "parameters": {"threshold_p95": "60"},
                "severity": "critical",
            },
        ],
    }


def test_good_configuration_resolves_every_rule_with_overrides():
    config = load_config(good())
    assert [r.spec.name for r in config.rules] == [
        "CPUBottleneck",
        "IOBottleneck",
        "LowGPUUtilization",
        "BatchSize",
        "GPUMemoryIncrease",
        "LoadBalancing",
        "MaxInitializationTime",
        "StepOutlier",
        "LaunchBoundSteps",
        "MemcpyHeavySteps",
        "NoReducedPrecision",
        "OverallSystemUsage",
        "OverallFrameworkMetrics",
    ]
    assert config.rule("CPUBottleneck").values["cpu_threshold"] == 95
    low = config.rule("LowGPUUtilization")
    # The standalone entry wins over the report's override for the same rule.
    assert low.values["threshold_p95"] == 60 and low.values["window"] == 500
    assert low.severity == "critical"
    assert config.scrape_interval == 30 and config.grafana_url == "https://grafana.example.com"
    assert any("also part of ProfilerReport" in w for w in config.warnings)


def test_strings_and_numbers_are_the_same_value():
    a = load_config({"rules": [{"rule": "BatchSize", "parameters": {"window": "250"}}]})
    b = load_config({"rules": [{"rule": "BatchSize", "parameters": {"window": 250}}]})
    assert a.rule("BatchSize").values == b.rule("BatchSize").values


def test_mapping_form_equals_list_form():
    listed = load_config({"rules": [{"rule": "StepOutlier", "parameters": {"stddev": 4}}]})
    mapped = load_config({"rules": {"StepOutlier": {"stddev": 4}}})
    assert listed.rule("StepOutlier").values == mapped.rule("StepOutlier").values


def test_describe_training_job_shape_is_read():
    response = {
        "TrainingJobName": "bert-1",
        "TrainingJobStatus": "Completed",
        "ProfilerConfig": {
            "S3OutputPath": "s3://bucket/out",
            "ProfilingIntervalInMilliseconds": 100,
        },
        "ProfilerRuleConfigurations": [
            {
                "RuleConfigurationName": "ProfilerReport-1700000000",
                "RuleEvaluatorImage": "895741380848.dkr.ecr.us-west-2.amazonaws.com/"
                "sagemaker-debugger-rules:latest",
                "RuleParameters": {
                    "rule_to_invoke": "ProfilerReport",
                    "CPUBottleneck_threshold": "30",
                },
            }
        ],
    }
    config = load_config(response)
    assert config.rule("CPUBottleneck").values["threshold"] == 30
    assert len(config.rules) == 13
    assert config.datapoint_interval == 0.1


def test_no_rules_key_means_the_default_profiler_report():
    assert len(load_config({"datapoint_interval": "1s"}).rules) == 13


def test_patience_mode_auto_is_per_rule():
    config = load_config({"rules": ["ProfilerReport"]})
    assert config.rule("LowGPUUtilization").patience_mode == "for"
    assert config.rule("GPUMemoryIncrease").patience_mode == "warmup"
    warm = load_config({"patience_mode": "warmup", "rules": ["LowGPUUtilization"]})
    assert warm.rule("LowGPUUtilization").patience_mode == "warmup"


def test_dataloader_override_is_ignored_with_a_warning():
    config = load_config(
        {"rules": [{"rule": "ProfilerReport", "parameters": {"Dataloader_min_threshold": 50}}]}
    )
    assert any("Dataloader" in w and "not implemented" in w for w in config.warnings)


def _mutate(path, value):
    def apply(cfg):
        node = cfg
        for key in path[:-1]:
            node = node[key]
        if value is _DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return cfg

    return apply


_DELETE = object()

BAD = [
    (
        "unknown top-level key suggests the nearest",
        _mutate(["patience_mod"], "for"),
        "patience_mod",
        "did you mean patience_mode?",
    ),
    (
        "datapoint interval that is not a duration",
        _mutate(["datapoint_interval"], "fast"),
        "datapoint_interval",
        "not a duration",
    ),
    (
        "negative scrape interval",
        _mutate(["scrape_interval"], -5),
        "scrape_interval",
        "zero or positive",
    ),
    (
        "unknown patience mode",
        _mutate(["patience_mode"], "fro"),
        "patience_mode",
        "did you mean for?",
    ),
    (
        "job label that is not a label name",
        _mutate(["job_labels"], ["ok", "not-ok"]),
        "job_labels[1]",
        "not a valid label name",
    ),
    (
        "job selector regex that does not compile",
        _mutate(["job_selector", "training_job"], {"regex": "(bert"}),
        "job_selector.training_job",
        "not a valid regular expression",
    ),
    (
        "job selector with an unknown operator",
        _mutate(["job_selector", "namespace"], {"regexp": "a"}),
        "job_selector.namespace",
        "{regex: ...}",
    ),
    (
        "link that is not a URL",
        _mutate(["links", "grafana_url"], "grafana:3000"),
        "links.grafana_url",
        "not an http(s) URL",
    ),
    (
        "unknown rule suggests the nearest",
        _mutate(["rules", 1, "rule"], "LowGPUUtilisation"),
        "rules[1]",
        "did you mean LowGPUUtilization?",
    ),
    (
        "unknown parameter suggests the nearest",
        _mutate(["rules", 1, "parameters"], {"threshold_p96": 50}),
        "rules[1].parameters.threshold_p96",
        "did you mean threshold_p95?",
    ),
    (
        "report override of an unknown parameter",
        _mutate(["rules", 0, "parameters"], {"CPUBottleneck_cpu_treshold": 95}),
        "rules[0].parameters.CPUBottleneck_cpu_treshold",
        "did you mean cpu_threshold?",
    ),
    (
        "report override of an unknown rule",
        _mutate(["rules", 0, "parameters"], {"GPUUtilization_window": 5}),
        "rules[0].parameters.GPUUtilization_window",
        "<Rule>_<parameter>",
    ),
    (
        "percentage above 100",
        _mutate(["rules", 1, "parameters"], {"threshold_p95": "170"}),
        "rules[1].parameters.threshold_p95",
        "between 0 and 100",
    ),
    (
        "window that is not a whole number",
        _mutate(["rules", 1, "parameters"], {"window": 2.5}),
        "rules[1].parameters.window",
        "not a whole number",
    ),
    (
        "window of zero",
        _mutate(["rules", 1, "parameters"], {"window": 0}),
        "rules[1].parameters.window",
        "at least 1",
    ),
    (
        "boolean where a number is expected",
        _mutate(["rules", 1, "parameters"], {"threshold_p5": True}),
        "rules[1].parameters.threshold_p5",
        "not a number",
    ),
    (
        "scan interval below a second",
        _mutate(["rules", 1, "parameters"], {"scan_interval_us": 5000}),
        "rules[1].parameters.scan_interval_us",
        "at least 1000000",
    ),
    (
        "severity that is not one of three",
        _mutate(["rules", 1, "severity"], "urgent"),
        "rules[1].severity",
        "not one of info, warning, critical",
    ),
    (
        "unknown key in a rule entry",
        _mutate(["rules", 1, "params"], {}),
        "rules[1].params",
        "did you mean parameters?",
    ),
    (
        "rule entry without a rule",
        _mutate(["rules", 1, "rule"], _DELETE),
        "rules[1]",
        "missing `rule`",
    ),
    (
        "the same rule twice",
        _mutate(["rules", 0], {"rule": "LowGPUUtilization"}),
        "rules[1]",
        "configured twice",
    ),
    (
        "rules that are a string",
        _mutate(["rules"], "ProfilerReport"),
        "rules",
        "expected a list or a mapping",
    ),
    ("an empty rule list", _mutate(["rules"], []), "rules", "no rules configured"),
    (
        "a Dataloader rule on its own",
        _mutate(["rules", 1], {"rule": "Dataloader"}),
        "rules[1]",
        "not implemented",
    ),
    (
        "StepOutlier mode that is not a mode",
        _mutate(["rules", 1], {"rule": "StepOutlier", "parameters": {"mode": "training"}}),
        "rules[1].parameters.mode",
        "not a mode",
    ),
    (
        "LoadBalancing threshold above 1",
        _mutate(["rules", 1], {"rule": "LoadBalancing", "parameters": {"threshold": 50}}),
        "rules[1].parameters.threshold",
        "between 0 and 1",
    ),
]


@pytest.mark.parametrize("mutation, path, message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_each_bad_case_names_its_path_and_what_is_wrong(mutation, path, message):
    with pytest.raises(ConfigError) as info:
        load_config(mutation(copy.deepcopy(good())), "rules.yaml")
    problems = [str(p) for p in info.value.problems]
    assert any(p.startswith(f"{path}:") and message in p for p in problems), problems


def test_every_problem_is_reported_at_once():
    cfg = good()
    cfg["patience_mode"] = "never"
    cfg["rules"][1]["parameters"] = {"threshold_p96": 1, "window": -1}
    cfg["rules"].append({"rule": "NoSuchRule"})
    with pytest.raises(ConfigError) as info:
        load_config(cfg, "rules.yaml")
    assert len(info.value.problems) == 4
    assert str(info.value).startswith("rules.yaml: 4 problems\n")


def test_a_document_that_is_not_a_mapping_is_one_clear_problem():
    with pytest.raises(ConfigError) as info:
        load_config("ProfilerReport", "rules.yaml")
    assert "expected a mapping with a `rules` list" in str(info.value)

"""The published JSON Schemas: valid, committed, and in agreement with the loaders.

An editor trusts the schema; trainprof trusts its loader. Both are checked against the same
configurations here, good and bad, so a schema that drifts from what trainprof accepts fails.
"""

from __future__ import annotations

import copy
import json
import re

import jsonschema
import pytest
import yaml

from trainprof.actions.config import load_actions_config
from trainprof.contract.validation import ConfigError
from trainprof.generation import schemas
from trainprof.rules.config import load_config


def _schema(root, path):
    return json.loads((root / path).read_text())


@pytest.fixture(scope="module")
def rules_validator(root):
    schema = _schema(root, schemas.RULES_SCHEMA)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def actions_validator(root):
    schema = _schema(root, schemas.ACTIONS_SCHEMA)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _schema_comment(path) -> str:
    first = path.read_text().splitlines()[0]
    match = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
    assert match, f"{path} does not start with a yaml-language-server $schema comment"
    return match.group(1)


def test_the_examples_name_the_committed_schemas_and_pass_them(
    root, rules_validator, actions_validator
):
    for example, validator, load in (
        (root / "examples" / "rules.yaml", rules_validator, load_config),
        (
            root / "alerting" / "actions" / "actions.example.yaml",
            actions_validator,
            load_actions_config,
        ),
    ):
        target = (example.parent / _schema_comment(example)).resolve()
        assert target.is_file(), target
        data = yaml.safe_load(example.read_text())
        assert list(validator.iter_errors(data)) == []
        load(data)


def test_the_docs_show_the_schema_comment_for_both_files(root):
    text = (root / "docs" / "configuration.md").read_text()
    for path in (schemas.RULES_SCHEMA, schemas.ACTIONS_SCHEMA):
        assert f"# yaml-language-server: $schema={schemas.SCHEMA_URL}{path.split('/')[1]}" in text


GOOD_RULES = [
    {"rules": ["ProfilerReport"]},
    {"rules": {"LowGPUUtilization": {"threshold_p95": "60"}, "StepOutlier": None}},
    {
        "datapoint_interval": "100ms",
        "job_selector": {"training_job": {"regex": "bert-.*"}, "namespace": "a"},
        "rules": [
            {
                "rule": "ProfilerReport",
                "parameters": {
                    "CPUBottleneck_cpu_threshold": 95,
                    "scan_interval_us": 30000000,
                    "StepOutlier_mode": "train",
                },
            }
        ],
    },
    {
        "ProfilerRuleConfigurations": [
            {"RuleParameters": {"rule_to_invoke": "BatchSize", "window": "40"}}
        ]
    },
]

BAD_RULES = [
    {"patience_mod": "for", "rules": ["BatchSize"]},
    {"datapoint_interval": 500, "rules": ["BatchSize"]},
    {"datapoint_interval": "fast", "rules": ["BatchSize"]},
    {"job_labels": [], "rules": ["BatchSize"]},
    {"job_labels": ["a", "a"], "rules": ["BatchSize"]},
    {"links": {"grafana_url": "https://g/{{ .Value }}"}, "rules": ["BatchSize"]},
    {"rules": ["LowGPUUtilisation"]},
    {"rules": [{"rule": "LowGPUUtilization", "parameters": {"threshold_p96": 50}}]},
    {"rules": [{"rule": "LowGPUUtilization", "parameters": {"threshold_p95": 170}}]},
    {"rules": [{"rule": "BatchSize", "parameters": {"window": 0}}]},
    {"rules": [{"rule": "BatchSize", "parameters": {"window": 2.5}}]},
    {"rules": [{"rule": "BatchSize", "params": {}}]},
    {"rules": [{"rule": "BatchSize", "severity": "urgent"}]},
    {"rules": [{"rule": "ProfilerReport", "parameters": {"CPUBottleneck_cpu_treshold": 1}}]},
    {"rules": [{"rule": "LoadBalancing", "parameters": {"threshold": 50}}]},
    {"rules": [{"rule": "BatchSize", "parameters": {"scan_interval_us": 5000}}]},
    {"rules": []},
]


@pytest.mark.parametrize("data", GOOD_RULES)
def test_schema_and_loader_accept_the_same_good_rule_configurations(data, rules_validator):
    assert [e.message for e in rules_validator.iter_errors(data)] == []
    load_config(copy.deepcopy(data))


@pytest.mark.parametrize("data", BAD_RULES)
def test_schema_and_loader_refuse_the_same_bad_rule_configurations(data, rules_validator):
    assert list(rules_validator.iter_errors(data)), f"the schema accepts {data}"
    with pytest.raises(ConfigError):
        load_config(copy.deepcopy(data))


GOOD_ACTIONS = {"token_env": "TOKEN", "rules": {"CPUBottleneck": "notify"}}
BAD_ACTIONS = [
    {**GOOD_ACTIONS, "dryrun": False},
    {**GOOD_ACTIONS, "cooldown": 600},
    {**GOOD_ACTIONS, "token_file": "/t"},
    {"token_env": "TOKEN", "rules": {"CPUBottlenek": "stop"}},
    {"token_env": "TOKEN", "rules": {"CPUBottleneck": "kill"}},
    {**GOOD_ACTIONS, "limits": {"requests_per_min": 5}},
    {**GOOD_ACTIONS, "kubernetes": {"resource": "Jobs"}, "local": {"jobs": {}}},
]


def test_schema_and_loader_agree_on_actions_configurations(actions_validator):
    assert list(actions_validator.iter_errors(GOOD_ACTIONS)) == []
    load_actions_config(GOOD_ACTIONS)
    for data in BAD_ACTIONS:
        assert list(actions_validator.iter_errors(data)), f"the schema accepts {data}"
        with pytest.raises(ConfigError):
            load_actions_config(data)


def test_every_rule_and_parameter_of_the_catalog_is_in_the_schema(root):
    from trainprof.rules import catalog

    defs = _schema(root, schemas.RULES_SCHEMA)["$defs"]
    for spec in catalog.CATALOG:
        assert set(defs[f"parameters.{spec.name}"]["properties"]) == {p.name for p in spec.params}
        report = defs["parameters.ProfilerReport"]["properties"]
        assert all(f"{spec.name}_{p.name}" in report for p in spec.params)


def test_every_key_the_loaders_read_is_in_the_schemas(root):
    from trainprof.actions import config as actions
    from trainprof.rules import config as rules

    rules_keys = set(_schema(root, schemas.RULES_SCHEMA)["properties"])
    assert rules_keys == set(rules._TOP_KEYS)
    actions_keys = set(_schema(root, schemas.ACTIONS_SCHEMA)["properties"])
    assert actions_keys == set(actions._TOP)

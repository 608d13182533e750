"""Custom rules and their overrides given hostile values: a text parameter that tried to
break out of its label value, text outside quotes, a regex Prometheus (RE2) refuses, Go
templates Prometheus refuses, numbers no alert reaches. Each is refused where it was given,
or, for a label value, kept one label value: the real `promtool test rules` evaluates the
compiled rule and only the series carrying that exact value fires."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from trainprof.generation.render import to_yaml
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import ConfigError, load_config
from trainprof.rules.promql import quote

pytestmark = pytest.mark.tools

COLLECTION_LARGE = {
    "custom": "CollectionLarge",
    "expr": 'max by (training_job) (trainprof_tensor_mean_abs{collection="{coll}"}) > {threshold}',
    "parameters": {"coll": "gradients", "threshold": 5},
    "description": "Mean of {coll} above {threshold}.",
}
BREAKOUT = 'a"} or vector(1) or up{x="'


def _alert(config) -> dict:
    return next(
        r
        for g in compile_rules(config).groups
        for r in g["rules"]
        if r.get("alert", "").startswith("TrainingCollection")
    )


def _problems(rules: list) -> str:
    with pytest.raises(ConfigError) as e:
        load_config({"rules": rules})
    return str(e.value)


@pytest.mark.parametrize("value", [BREAKOUT, "a\nb", "a\\\"b'c`d", "tab\there"], ids=repr)
def test_a_text_override_stays_one_label_value_when_promtool_evaluates_it(
    promtool, tmp_path, value
):
    override = {"rule": "CollectionLarge", "parameters": {"coll": value}}
    config = load_config({"rules": [COLLECTION_LARGE, override]})
    alert = _alert(config)
    rules = tmp_path / "rules.yaml"
    rules.write_text(to_yaml({"groups": compile_rules(config).groups}))
    # Series that an escaped value must not reach: every other collection, and `up`, which
    # the break-out's `or up{x=""}` would read; vector(1) would fire with no job at all.
    series = [
        {"series": 'up{x=""}', "values": "1x10"},
        {
            "series": 'trainprof_tensor_mean_abs{collection="a", training_job="other"}',
            "values": "9x10",
        },
        {
            "series": f'trainprof_tensor_mean_abs{{collection={quote(value)}, training_job="j"}}',
            "values": "9x10",
        },
    ]
    expected = {**alert["labels"], "training_job": "j"}
    annotations = {
        **alert["annotations"],
        "description": f"Mean of {value} above 5.",
        "dashboard_url": alert["annotations"]["dashboard_url"]
        .replace("{{ $labels.training_job | urlquery }}", "j")
        .replace("{{ $labels.namespace | urlquery }}", ""),
    }
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": "5m",
                        "alertname": alert["alert"],
                        "exp_alerts": [{"exp_labels": expected, "exp_annotations": annotations}],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "test.yaml"
    path.write_text(yaml.safe_dump(test))
    done = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_text_outside_quotes_is_refused_where_it_was_given(promtool):
    any_metric = {
        "custom": "AnyMetric",
        "expr": "max by (training_job) ({metric}) > {threshold}",
        "parameters": {"metric": "trainprof_tensor_mean_abs", "threshold": 5},
    }
    load_config({"rules": [any_metric]})  # a metric name stands there
    text = _problems(
        [any_metric, {"rule": "AnyMetric", "parameters": {"metric": "up) or vector(1) or (up"}}]
    )
    assert (
        "rules[1].parameters.metric: 'up) or vector(1) or (up' cannot stand outside quotes in "
        "the expression: only a number, a metric or label name or a duration can" in text
    )


def test_a_regex_parameter_must_be_one_prometheus_accepts(promtool):
    rule = {
        "custom": "SomeCollections",
        "expr": 'max by (training_job) (trainprof_tensor_mean_abs{collection=~"{pattern}"}) > 5',
        "parameters": {"pattern": "grad.*"},
    }
    text = _problems(
        [rule, {"rule": "SomeCollections", "parameters": {"pattern": "(?!weights).*"}}]
    )
    assert "rules[1].parameters.pattern: '(?!weights).*' uses a negative lookahead" in text
    # in a longer regex the whole is Prometheus' to judge: promtool, at the definition
    longer = {**rule, "expr": rule["expr"].replace('"{pattern}"', '"x{pattern}"')}
    text = _problems([{**longer, "parameters": {"pattern": "(?<=a)"}}])
    assert (
        "rules[0].expr: not valid PromQL: " in text and "invalid or unsupported Perl syntax" in text
    )


@pytest.mark.parametrize("rule", ["AllZero", "UnchangedTensor", "ExplodingTensor"])
def test_a_built_in_rules_tensor_regex_must_be_one_prometheus_accepts(rule, promtool, tmp_path):
    entry = {"rule": rule, "parameters": {"tensor_regex": "(?!bias).*"}}
    text = _problems([entry])
    assert "rules[0].parameters.tensor_regex: '(?!bias).*' uses a negative lookahead" in text
    entry["parameters"] = {"tensor_regex": ".*weight", "collection_names": 'a"} or vector(1) #, b'}
    path = tmp_path / "rules.yaml"
    path.write_text(to_yaml({"groups": compile_rules(load_config({"rules": [entry]})).groups}))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_go_templates_are_checked_when_the_configuration_is_loaded(promtool):
    text = _problems(
        [
            {**COLLECTION_LARGE, "description": "{{ $value | nosuchfn }}"},
            {**COLLECTION_LARGE, "custom": "Second", "recommendation": "{{ end }}"},
        ]
    )
    assert (
        "rules[0].description: not a valid template: " in text
        and 'function "nosuchfn" not defined' in text
    )
    assert (
        "rules[1].recommendation: not a valid template: " in text and "unexpected {{end}}" in text
    )
    # a parameter bringing a template into the description is refused where it was given
    text = _problems(
        [COLLECTION_LARGE, {"rule": "CollectionLarge", "parameters": {"coll": "{{ end }}"}}]
    )
    assert "rules[1].parameters.coll: '{{ end }}' contains {{ or }}" in text


@pytest.mark.parametrize(
    "value", [float("inf"), float("-inf"), float("nan"), "inf", "-Inf", "NaN"], ids=repr
)
def test_numbers_no_alert_can_reach_are_refused(promtool, value):
    rule = {"custom": "Never", "expr": "up > {threshold}", "parameters": {"threshold": value}}
    text = _problems([rule])
    assert "rules[0].parameters.threshold: " in text and "is not a finite number" in text
    text = _problems(
        [
            {**rule, "parameters": {"threshold": 1}},
            {"rule": "Never", "parameters": {"threshold": value}},
        ]
    )
    assert "rules[1].parameters.threshold: " in text and "is not a finite number" in text


def test_every_custom_rule_is_checked_in_one_promtool_run_with_its_own_path(promtool):
    rules = [
        {"custom": f"Rule{i}", "expr": "up > {threshold}", "parameters": {"threshold": i}}
        for i in range(20)
    ]
    rules[3]["description"] = "{{ end }}"
    rules[17]["expr"] = "up >> {threshold}"
    text = _problems(rules)
    assert "2 problems" in text
    assert "rules[3].description: not a valid template" in text
    assert "rules[17].expr: not valid PromQL: " in text

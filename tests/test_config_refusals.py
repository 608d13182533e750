"""Configurations that cannot be right are refused with the fix, exit 2, never a traceback.

Each case here was accepted (or ended in a traceback) before: misspelled rules and SDK
keywords silently lost, unitless durations read as seconds, overflowing numbers, documents
nested too deeply, and settings that compiled to rules promtool then rejected.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from trainprof.cli import main
from trainprof.contract.validation import ConfigError, regex_problem
from trainprof.rules.config import default_config, load_config
from trainprof.rules.files import read_config


def compile_text(tmp_path, capsys, text: str, suffix: str = "yaml", *flags: str):
    """(exit code, stdout, stderr) of `trainprof rules compile -c FILE -o -`."""
    path = tmp_path / f"launch.{suffix}"
    path.write_text(text)
    try:
        code = main(["rules", "compile", "-c", str(path), "-o", "-", *flags])
    except SystemExit as e:  # argparse refusing a flag
        code = e.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


# --- pasted SageMaker SDK code -----------------------------------------------------------------

MISSPELLED_RULE = """\
from sagemaker.debugger import ProfilerRule, rule_configs
rules = [
    ProfilerRule.sagemaker(rule_configs.ProfilerReport()),
    ProfilerRule.sagemaker(rule_configs.LowGPUUtilisation(),
                           rule_parameters={"threshold_p95": "60"}),
]
"""


def test_a_misspelled_rule_in_pasted_python_is_an_error_at_its_line(tmp_path, capsys):
    code, out, err = compile_text(tmp_path, capsys, MISSPELLED_RULE, "py")
    assert code == 2 and out == ""
    assert "launch.py:4 (rules[1]): unknown rule 'LowGPUUtilisation'" in err
    assert "did you mean LowGPUUtilization?" in err


def test_a_bare_misspelled_rule_config_call_is_an_error_too(tmp_path, capsys):
    code, _, err = compile_text(tmp_path, capsys, "rule_configs.BatchSise(window=5)\n", "py")
    assert code == 2 and "launch.py:1 (rules[0])" in err and "did you mean BatchSize?" in err


def test_a_misspelled_parameter_in_pasted_python_points_at_its_line(tmp_path, capsys):
    text = "x = 1\nrules = [rule_configs.BatchSize(windw=5)]\n"
    code, _, err = compile_text(tmp_path, capsys, text, "py")
    assert code == 2
    assert "launch.py:2 (rules[0].parameters.windw): unknown parameter of BatchSize" in err
    assert "did you mean window?" in err


@pytest.mark.parametrize(
    "line, expected",
    [
        (
            "ProfilerRule.sagemaker(rule_configs.BatchSize(), rule_parameter={'window': 5})",
            "has no parameter 'rule_parameter' (did you mean rule_parameters?)",
        ),
        (
            "ProfilerRules.sagemaker(rule_configs.BatchSize(), rule_parameters={'window': 5})",
            "ProfilerRules.sagemaker() is not a SageMaker call (did you mean "
            "ProfilerRule.sagemaker?)",
        ),
        (
            "profiler_config = ProfilerConfig(system_monitor_interval=100)",
            "ProfilerConfig() has no parameter 'system_monitor_interval' (did you mean "
            "system_monitor_interval_millis?)",
        ),
    ],
)
def test_typos_in_sdk_calls_are_reported_not_dropped(tmp_path, capsys, line, expected):
    text = f"rules = [ProfilerRule.sagemaker(rule_configs.StepOutlier())]\n{line}\n"
    code, _, err = compile_text(tmp_path, capsys, text, "py")
    assert code == 2
    assert f"launch.py:2: {expected}" in err or ("launch.py:2" in err and expected in err), err


def test_a_debugger_rule_trainprof_does_not_implement_is_skipped_with_a_warning(tmp_path, capsys):
    text = (
        "rules = [Rule.sagemaker(rule_configs.create_xgboost_report()),\n"
        "         Rule.sagemaker(rule_configs.vanishing_gradient()),\n"
        "         ProfilerRule.sagemaker(rule_configs.BatchSize())]\n"
    )
    code, out, err = compile_text(tmp_path, capsys, text, "py")
    assert code == 0 and "create_xgboost_report() is not a SageMaker Debugger rule" in err
    assert "vanishing_gradient" not in err
    assert "BatchSize" in out and "VanishingGradient" in out


@pytest.mark.parametrize(
    "text",
    [
        "x = " + "(" * 500 + "1" + ")" * 500 + "\n",
        "x = " + "-" * 100_000 + "1\n",
        "rule_configs.BatchSize(window=a" + ".a" * 50_000 + ")\n",
        "rule_configs.BatchSize(window=" + "9" * 5000 + ")\n",
        "ProfilerConfig(system_monitor_interval_millis=" + "9" * 400 + ")\n"
        "rule_configs.BatchSize()\n",
        "rule_configs.BatchSize()\x00\n",
    ],
    ids=["parentheses", "unary", "attributes", "huge-int", "huge-millis", "nul"],
)
def test_pathological_python_is_a_clear_error(tmp_path, capsys, text):
    code, _, err = compile_text(tmp_path, capsys, text, "py")
    assert code == 2 and err.startswith("error: ")


# --- durations and percentages -----------------------------------------------------------------


def test_a_duration_without_a_unit_is_refused_with_the_fix(tmp_path, capsys):
    code, _, err = compile_text(tmp_path, capsys, "datapoint_interval: 500\n")
    assert code == 2
    assert "datapoint_interval: 500 has no unit: write 500ms for milliseconds or 500s" in err
    code, _, err = compile_text(
        tmp_path, capsys, "rules: [BatchSize]\n", "yaml", "--datapoint-interval", "500"
    )
    assert code == 2 and "has no unit: write 500ms" in err
    with pytest.raises(SystemExit) as exited:
        main(["replay", str(tmp_path), "--datapoint-interval", "500"])
    assert exited.value.code == 2
    assert "has no unit: write 500ms" in capsys.readouterr().err


def test_a_duration_below_prometheus_resolution_is_refused_in_files():
    with pytest.raises(ConfigError, match="shorter than a millisecond"):
        load_config({"scrape_interval": "0.0001ms"})


def test_zero_and_durations_with_units_are_still_accepted():
    config = load_config({"datapoint_interval": "500ms", "scrape_interval": "1m"})
    assert (config.datapoint_interval, config.scrape_interval) == (0.5, 60.0)


@pytest.mark.parametrize("flag", ["--scrape-interval", "--datapoint-interval"])
@pytest.mark.parametrize("value", ["1e400", "inf", "nan", "1e300s", "0.0001ms"])
def test_durations_prometheus_cannot_count_are_refused_on_the_command_line(
    tmp_path, capsys, flag, value
):
    code, _, err = compile_text(tmp_path, capsys, "rules: [BatchSize]\n", "yaml", flag, value)
    assert code == 2, err


def test_a_percentage_written_as_a_ratio_warns_naming_the_likely_intent():
    config = load_config(
        {"rules": [{"rule": "LowGPUUtilization", "parameters": {"threshold_p95": 0.7}}]}
    )
    assert config.rule("LowGPUUtilization").values["threshold_p95"] == 0.7
    (warning,) = [w for w in config.warnings if "threshold_p95" in w]
    assert warning.startswith("rules[0].parameters.threshold_p95: 0.7 is read as 0.7 %")
    assert "if you meant 70 %, write 70" in warning
    plain = load_config({"rules": [{"rule": "LowGPUUtilization", "parameters": {"window": 5}}]})
    assert plain.warnings == ()


# --- numbers and documents the readers choke on ------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "rules: [{rule: BatchSize, parameters: {window: " + "9" * 400 + "}}]\n",
        "rules: [{rule: BatchSize, parameters: {window: " + "9" * 5000 + "}}]\n",
        "rules: [{rule: BatchSize, parameters: {window: 1.0e400}}]\n",
        "rules: [{rule: MaxInitializationTime, parameters: {threshold: " + "9" * 400 + "}}]\n",
        "rules: [{rule: BatchSize, parameters: {window: 100000000000000}}]\n",
        "rules: [{rule: BatchSize, parameters: {scan_interval_us: " + "9" * 30 + "}}]\n",
        "[" * 5000 + "]" * 5000 + "\n",
        "rules: [ProfilerReport]\x07\n",
    ],
    ids=[
        "int-beyond-float",
        "int-beyond-str",
        "float-overflow",
        "minutes-overflow",
        "window-too-long",
        "scan-too-long",
        "deep-yaml",
        "reader-error",
    ],
)
def test_overflowing_and_unreadable_documents_are_clear_errors(tmp_path, capsys, text):
    code, out, err = compile_text(tmp_path, capsys, text)
    assert code == 2 and out == "" and err.startswith("error: "), err


def test_tab_indented_json_is_read_as_json(tmp_path, capsys):
    text = '{\n\t"rules": [\n\t\t{"rule": "BatchSize", "parameters": {"window": "40"}}\n\t]\n}\n'
    code, out, err = compile_text(tmp_path, capsys, text, "json")
    assert code == 0, err
    assert "BatchSize" in out
    assert read_config(str(tmp_path / "launch.json")).rule("BatchSize").values["window"] == 40


def test_a_typo_in_a_describe_training_job_response_is_reported():
    response = {
        "TrainingJobName": "bert-1",
        "ProfilerConfig": {"ProfilingIntervalInMiliseconds": 100},
        "ProfilerRuleConfigurations": [
            {
                "RuleConfigurationName": "ProfilerReport-1",
                "RuleParameter": {"rule_to_invoke": "ProfilerReport"},
            }
        ],
    }
    with pytest.raises(ConfigError) as raised:
        load_config(response, "describe.json")
    problems = [str(p) for p in raised.value.problems]
    assert any(
        p.startswith(
            "ProfilerConfig.ProfilingIntervalInMiliseconds: unknown key (did you mean "
            "ProfilingIntervalInMilliseconds?)"
        )
        for p in problems
    ), problems
    assert any(
        p.startswith(
            "ProfilerRuleConfigurations[0].RuleParameter: unknown key (did you mean "
            "RuleParameters?)"
        )
        for p in problems
    ), problems


# --- what promtool would reject ----------------------------------------------------------------

PROMTOOL_REJECTS = [
    ({"job_labels": []}, "job_labels", "empty"),
    ({"job_labels": ["training_job", "training_job"]}, "job_labels[1]", "listed twice"),
    ({"links": {"grafana_url": "https://grafana/d?x={{"}}, "links.grafana_url", "template"),
    ({"links": {"runbook_url": "https://runbooks/{{ end }}"}}, "links.runbook_url", "template"),
    # a well-formed template passes promtool, and runs in every alert: injection
    ({"links": {"runbook_url": "https://runbooks/{{.Value}}"}}, "links.runbook_url", "template"),
    ({"job_selector": {"__name__": "up"}}, "job_selector.__name__", "Prometheus's own"),
    ({"job_selector": {"training_job": "bert\ud800"}}, "job_selector.training_job", "surrogate"),
    ({"job_selector": {"training_job": {"regex": "bert(?=-)"}}}, "job_selector", "lookahead"),
    ({"job_selector": {"training_job": {"not_regex": "(a)\\1"}}}, "job_selector", "backref"),
    ({"job_selector": {"training_job": {"regex": "a++"}}}, "job_selector", "possessive"),
    ({"job_selector": {"training_job": {"regex": "(?x)a b"}}}, "job_selector", "flag"),
    ({"job_selector": {"training_job": {"regex": "a{1001}"}}}, "job_selector", "repeat count"),
    ({"job_selector": {"training_job": {"regex": "a\\Z"}}}, "job_selector", "\\Z"),
]


@pytest.mark.parametrize("change, path, words", PROMTOOL_REJECTS)
def test_settings_promtool_rejects_are_refused_at_validation(change, path, words):
    with pytest.raises(ConfigError) as raised:
        load_config({**change, "rules": ["BatchSize"]}, "rules.yaml")
    (problem,) = raised.value.problems
    assert problem.path.startswith(path) and words in str(problem), str(problem)


def _compiled_with(change: dict, tmp_path) -> str:
    """The rules a setting compiles to when validation lets it through (checks the check)."""
    from trainprof.rules import files
    from trainprof.rules.compiler import compile_rules

    config = load_config({"rules": ["ProfilerReport"]})
    import dataclasses

    from trainprof.rules.promql import Matcher

    fields = {}
    if "job_labels" in change:
        fields["job_labels"] = tuple(change["job_labels"])
    if "links" in change:
        fields["grafana_url"] = change["links"].get("grafana_url", config.grafana_url)
        fields["runbook_url"] = change["links"].get("runbook_url", config.runbook_url)
    if "job_selector" in change:
        ((label, spec),) = change["job_selector"].items()
        ops = {"regex": "=~", "not_regex": "!~"}
        if isinstance(spec, dict):
            ((op, text),) = spec.items()
            fields["job_selector"] = (Matcher(label, ops[op], text),)
        else:
            fields["job_selector"] = (Matcher(label, "=", spec),)
    config = dataclasses.replace(config, **fields)
    path = tmp_path / "rules.yaml"
    path.write_text(files.render(compile_rules(config), "rules", "test"))
    return str(path)


@pytest.mark.parametrize("change, path, words", PROMTOOL_REJECTS)
def test_promtool_indeed_rejects_what_validation_refuses(change, path, words, tmp_path, promtool):
    rules = _compiled_with(change, tmp_path)
    result = subprocess.run([promtool, "check", "rules", rules], capture_output=True, text=True)
    if path.startswith("job_labels[1]") or "{{.Value}}" in str(change):
        # pass promtool, but double every `by` / run the user's text as a template
        return
    assert result.returncode != 0, f"promtool accepted {change}: refusing it is not needed"


def test_go_regex_check_accepts_what_prometheus_accepts():
    for text in ("bert-.*", "(?i)bert", "[[:alpha:]]+", "a{2,1000}", "(?P<n>x)", "[\\]a]", "\\d+"):
        assert regex_problem(text) is None, text


def test_defaults_still_compile_and_match_the_committed_rules(root):
    from trainprof.rules import files
    from trainprof.rules.compiler import compile_rules

    committed = yaml.safe_load((root / "rules" / "trainprof.rules.yaml").read_text())
    compiled = compile_rules(default_config())
    assert committed == yaml.safe_load(files.render(compiled, "rules", "make generate"))
    assert default_config().job_labels == ("namespace", "training_job")


# --- warnings only about what the user wrote ---------------------------------------------------


def test_a_default_configuration_compiles_without_warnings(tmp_path, capsys):
    from trainprof.rules.compiler import compile_rules

    assert compile_rules(default_config()).warnings == ()
    assert main(["rules", "compile", "-o", str(tmp_path)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_window_the_user_set_too_short_still_warns():
    from trainprof.rules.compiler import compile_rules

    config = load_config({"rules": [{"rule": "GPUMemoryIncrease", "parameters": {"window": 12}}]})
    (warning,) = compile_rules(config).warnings
    assert warning.startswith("rules[0].parameters.window: GPUMemoryIncrease's window of 12")
    report = load_config({"rules": [{"rule": "ProfilerReport"}]})
    assert compile_rules(report).warnings == ()


def test_the_default_window_adjustment_stays_out_of_the_report_notes(tmp_path, promtool):
    from trainprof.replay import replay
    from trainprof.replay.synthetic import write_system

    hosts = {"algo-1": {"cores": 2, "gpus": 1, "timeline": [{"gpu_util": 0.9, "cpu": 0.5}]}}
    out = tmp_path / "job" / "profiler-output"
    write_system(str(out), start=1_700_000_000, duration=120, interval=0.5, hosts=hosts)
    result = replay(str(tmp_path / "job"), None, scrape_interval=15)
    assert not [n for n in result.notes if "GPUMemoryIncrease" in n], result.notes


def test_a_window_of_minutes_with_a_fraction_compiles_to_valid_durations(tmp_path, promtool):
    """Kernel-profile windows are minutes: 1.5 once became `[1.5m]` and a traceback."""
    text = "rules: [{rule: LaunchBoundSteps, parameters: {window: 1.5}}, MemcpyHeavySteps]\n"
    (tmp_path / "rules.yaml").write_text(text)
    assert main(["rules", "compile", "-c", str(tmp_path / "rules.yaml"), "-o", str(tmp_path)]) == 0
    rules = tmp_path / "trainprof.rules.yaml"
    assert "[1m30s]" in rules.read_text()
    result = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True)
    assert result.returncode == 0, result.stdout
    with pytest.raises(ConfigError, match="less than a second"):
        load_config({"rules": [{"rule": "LaunchBoundSteps", "parameters": {"window": 0.001}}]})

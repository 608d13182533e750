"""The compiler's promises: names, labels, annotations, determinism, escaping, windows."""

from __future__ import annotations

import re
import subprocess

import pytest

from trainprof.contract import metrics as contract
from trainprof.contract.names import HEALTH_RULE
from trainprof.generation.render import to_yaml
from trainprof.rules import catalog
from trainprof.rules.compiler import compile_rules, required_inputs
from trainprof.rules.config import default_config, load_config
from trainprof.rules.model import RECORD_NAME

SELECTED = re.compile(r"(?<![\w:])(trainprof_[a-z0-9_]+)(?![\w:])")


def _rules(compiled):
    return [r for g in compiled.groups for r in g["rules"]]


def test_recording_names_are_level_metric_operations():
    for rule in _rules(compile_rules(default_config())):
        if "record" in rule:
            assert RECORD_NAME.match(rule["record"]), rule["record"]


def test_every_alert_carries_provenance_labels_and_annotations():
    for rule in _rules(compile_rules(default_config())):
        if "alert" not in rule:
            continue
        assert {"rule", "severity", "trainprof_rule_version"} <= set(rule["labels"])
        assert "{{" not in rule["annotations"]["summary"]
        assert {"summary", "description"} <= set(rule["annotations"])
        if rule["labels"]["rule"] not in ("TrainprofHealth", "TrainprofState"):
            assert {"recommendation", "runbook_url", "dashboard_url"} <= set(rule["annotations"])
            assert "$value" in rule["annotations"]["description"]


def test_every_catalog_alert_is_compiled_once_per_rule():
    from trainprof.rules.tensors import example_tensor_config

    alerts = {r["labels"]["rule"] for r in _rules(compile_rules(default_config())) if "alert" in r}
    assert {r.name for r in catalog.profiler_rules() if r.alerting} <= alerts
    tensors = [r for r in _rules(compile_rules(example_tensor_config())) if "alert" in r]
    names = [r["labels"]["rule"] for r in tensors if r["labels"]["rule"] != HEALTH_RULE]
    assert sorted(names) == sorted(r.name for r in catalog.CATALOG if r.family == "health")


def test_rules_select_only_contract_metrics():
    names = {n for m in contract.METRICS for n in contract.series_names(m)}
    for rule in _rules(compile_rules(default_config())):
        for name in SELECTED.findall(rule["expr"]):
            if ":" not in name:
                assert name in names, f"{name} in {rule.get('alert') or rule.get('record')}"


def test_compiling_twice_gives_identical_bytes():
    a = to_yaml({"groups": compile_rules(default_config()).groups})
    b = to_yaml({"groups": compile_rules(default_config()).groups})
    assert a == b


def test_windows_and_patience_translate_into_time():
    config = load_config(
        {
            "datapoint_interval": "1s",
            "rules": [
                {
                    "rule": "LowGPUUtilization",
                    "parameters": {"window": 300, "patience": 600, "scan_interval_us": 30_000_000},
                }
            ],
        }
    )
    group = compile_rules(config).groups[0]
    assert group["interval"] == "30s"
    assert "[5m]" in group["rules"][0]["expr"]
    assert {r["for"] for r in group["rules"] if "alert" in r} == {"10m"}


def test_a_window_shorter_than_two_scrapes_is_raised_with_a_warning():
    entry = {"rule": "GPUMemoryIncrease", "parameters": {"window": 10}}
    config = load_config({"rules": [entry]}, scrape_interval=60)
    compiled = compile_rules(config)
    assert any("GPUMemoryIncrease" in w and "using 2m" in w for w in compiled.warnings)
    assert "[2m]" in _rules(compiled)[0]["expr"]
    # The default window is raised the same way, without a warning: the user did not write it.
    default = compile_rules(load_config({"rules": ["GPUMemoryIncrease"]}, scrape_interval=60))
    assert default.warnings == () and "[2m]" in _rules(default)[0]["expr"]


def test_off_grid_thresholds_warn_that_exporters_need_the_configuration():
    config = load_config(
        {
            "rules": [
                {"rule": "IOBottleneck", "parameters": {"io_threshold": 65}},
                {"rule": "StepOutlier", "parameters": {"stddev": 2.5}},
            ]
        }
    )
    warnings = compile_rules(config).warnings
    assert any(
        "io_threshold: 65 is not on the exporter's default threshold grid" in w for w in warnings
    )
    assert any("stddev: 2.5" in w for w in warnings)
    needed = required_inputs(config)
    assert needed["io_bottleneck"] == [(0.65, 0.1)] and needed["step_outlier_stddevs"] == [2.5]


def test_a_recording_shared_by_two_rules_is_written_once_and_inlined_elsewhere():
    compiled = compile_rules(default_config())
    records = [r["record"] for r in _rules(compiled) if "record" in r]
    name = "gpu:trainprof_gpu_utilization_sampled_ratio:fraction_below70_rate4m10s"
    assert records.count(name) == 1
    batch = next(g for g in compiled.groups if g["name"] == "trainprof.BatchSize")
    # the alert's condition, recorded per GPU in the alert's own group
    condition = next(r for r in batch["rules"] if r.get("record", "").endswith(":affected"))
    assert name not in condition["expr"]
    assert (
        'rate(trainprof_gpu_utilization_sampled_ratio_bucket{le="0.7"}[4m10s])'
        in (condition["expr"])
    )


def test_quantile_thresholds_on_bucket_bounds_read_one_bucket_others_interpolate():
    on_bound = compile_rules(load_config({"rules": ["LowGPUUtilization"]}))
    exprs = "\n".join(r["expr"] for r in _rules(on_bound))
    assert "histogram_quantile" not in exprs and 'le="0.7"' in exprs and 'le="0.1"' in exprs
    off = compile_rules(
        load_config({"rules": [{"rule": "LowGPUUtilization", "parameters": {"threshold_p95": 72}}]})
    )
    exprs = "\n".join(r["expr"] for r in _rules(off))
    assert "histogram_quantile(0.95" in exprs and "p95_rate4m10s < 0.72" in exprs
    assert 'le="0.1"' in exprs  # threshold_p5 = 10 is still a bucket bound


HOSTILE = ['a"b', "back\\slash", "new\nline", "{{ $labels.x }}", "}) or vector(1) #"]


@pytest.mark.parametrize(
    "value", HOSTILE, ids=["quote", "backslash", "newline", "template", "injection"]
)
def test_hostile_selector_values_are_escaped_and_promtool_accepts_them(value, promtool, tmp_path):
    config = load_config(
        {
            "job_selector": {"training_job": value, "namespace": {"regex": "team-(a|b)"}},
            "rules": ["ProfilerReport"],
        }
    )
    text = to_yaml({"groups": compile_rules(config).groups})
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "or vector(1)" not in text.replace('or vector(1) #"', "")
    assert 'namespace=~"team-(a|b)"' in text


def test_summary_groups_run_at_the_cadence_their_readers_need():
    def intervals(scan_us: int) -> dict[str, str]:
        config = load_config(
            {"rules": [{"rule": "ProfilerReport", "parameters": {"scan_interval_us": scan_us}}]}
        )
        return {g["name"]: g["interval"] for g in compile_rules(config).groups}

    fleet = intervals(15_000_000)
    assert fleet["trainprof.LowGPUUtilization"] == "15s"
    assert fleet["trainprof.OverallSystemUsage"] == "1m"
    assert fleet["trainprof.OverallFrameworkMetrics"] == "1m"
    fast = intervals(1_000_000)
    assert (fast["trainprof.CPUBottleneck"], fast["trainprof.OverallSystemUsage"]) == ("1s", "4s")
    slow = intervals(300_000_000)
    assert slow["trainprof.OverallSystemUsage"] == "5m"

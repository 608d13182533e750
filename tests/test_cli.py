"""`trainprof rules ...` as a user runs it: exit codes, files written, no tracebacks."""

from __future__ import annotations

import subprocess
import sys

import yaml

ESTIMATOR = """
from sagemaker.debugger import ProfilerRule, rule_configs
rules = [ProfilerRule.sagemaker(rule_configs.ProfilerReport(CPUBottleneck_threshold=30))]
"""


def run(*args, stdin=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=60,
    )


def test_compile_without_a_config_writes_the_default_profiler_report(tmp_path):
    result = run("rules", "compile", "-o", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    groups = yaml.safe_load((tmp_path / "out" / "trainprof.rules.yaml").read_text())["groups"]
    assert len(groups) == 15
    assert "13 rules -> " in result.stderr


def test_compile_prometheusrule_with_labels_and_namespace(tmp_path):
    result = run(
        "rules",
        "compile",
        "-o",
        str(tmp_path),
        "--format",
        "prometheusrule",
        "--namespace",
        "monitoring",
        "--label",
        "release=kube-prometheus-stack",
    )
    assert result.returncode == 0, result.stderr
    doc = yaml.safe_load((tmp_path / "trainprof.prometheusrule.yaml").read_text())
    assert doc["kind"] == "PrometheusRule"
    assert doc["metadata"]["namespace"] == "monitoring"
    assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_compile_reads_pasted_sdk_code(tmp_path):
    script = tmp_path / "launch.py"
    script.write_text(ESTIMATOR)
    result = run("rules", "compile", "-c", str(script), "-o", "-")
    assert result.returncode == 0, result.stderr
    assert "> 0.3" in result.stdout


def test_compile_reads_stdin_and_honours_scrape_interval():
    result = run(
        "rules",
        "compile",
        "-c",
        "-",
        "-o",
        "-",
        "--scrape-interval",
        "1m",
        # a window the user wrote: only what the user wrote is warned about
        stdin="rules: [{rule: GPUMemoryIncrease, parameters: {window: 10}}]\n",
    )
    assert result.returncode == 0, result.stderr
    assert "[2m]" in result.stdout and "using 2m" in result.stderr


def test_bad_configuration_exits_2_listing_every_problem_without_traceback(tmp_path):
    bad = tmp_path / "rules.yaml"
    bad.write_text(
        "rules:\n  - rule: LowGPUUtilisation\n  - rule: StepOutlier\n    parameters: {stdev: 3}\n"
    )
    result = run("rules", "compile", "-c", str(bad), "-o", str(tmp_path / "out"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert (
        "rules[0]: unknown rule 'LowGPUUtilisation' (did you mean LowGPUUtilization?)"
        in result.stderr
    )
    assert (
        "rules[1].parameters.stdev: unknown parameter of StepOutlier (did you mean stddev?)"
        in result.stderr
    )
    assert not (tmp_path / "out").exists()


def test_broken_yaml_names_the_line():
    result = run("rules", "validate", "-c", "-", stdin="rules: [ProfilerReport\n")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "line 2" in result.stderr and "not valid YAML" in result.stderr


def test_missing_file_and_binary_file_are_clear_errors(tmp_path):
    missing = run("rules", "validate", "-c", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "cannot read: No such file or directory" in missing.stderr
    binary = tmp_path / "rules.bin"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    result = run("rules", "validate", "-c", str(binary))
    assert result.returncode == 2 and "not a text file" in result.stderr


def test_unwritable_output_is_exit_1_without_traceback(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = run("rules", "compile", "-o", str(blocker / "sub"))
    assert result.returncode == 1 and "cannot write" in result.stderr
    assert "Traceback" not in result.stderr


def test_validate_prints_resolved_parameters():
    result = run("rules", "validate", "-c", "-", stdin="rules: {BatchSize: {window: '250'}}\n")
    assert result.returncode == 0
    assert "BatchSize" in result.stdout and "window=250" in result.stdout


def test_bad_flag_values_are_rejected_by_the_parser():
    result = run("rules", "compile", "-o", "-", "--scrape-interval", "soon")
    assert result.returncode == 2 and "not a duration" in result.stderr


def test_list_shows_every_catalog_rule():
    result = run("rules", "list")
    for name in ("CPUBottleneck", "LoadBalancing", "OverallFrameworkMetrics"):
        assert name in result.stdout

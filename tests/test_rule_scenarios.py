"""Every scenario in tests/scenarios runs through the real `promtool test rules`."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from scenario import load_cases, promtool_files

CASES = load_cases()
# What an alert may carry: the job, the rule's own labels, and the thresholds a bottleneck
# rule was compiled for. No GPU, node, rank or other unit: one alert per job and rule.
JOB_AND_RULE = {
    "namespace",
    "training_job",
    "rule",
    "severity",
    "trainprof_rule_version",
    "reason",
    "affects",
    "cpu_above",
    "iowait_above",
    "gpu_below",
}


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_scenario(case, promtool, tmp_path):
    test_file = promtool_files(case, tmp_path)
    # promtool compares the alerts exactly: expecting only these labels pins what fires
    for check in yaml.safe_load(test_file.read_text())["tests"][0].get("alert_rule_test", []):
        for alert in check.get("exp_alerts", []):
            assert set(alert["exp_labels"]) <= JOB_AND_RULE, alert
    result = subprocess.run(
        [promtool, "test", "rules", test_file.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"promtool test rules failed for {case['name']!r} (files in {tmp_path}):\n"
        f"{result.stdout}\n{result.stderr}"
    )

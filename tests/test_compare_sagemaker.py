"""`trainprof compare --sagemaker JOB_DIR`: SageMaker's own ProfilerReport verdicts beside
trainprof's replay of the job's raw profiler data, run with the parameters SageMaker ran
with; alone, and marked so, where only the reports exist (the real jobs of tests/data)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import jsonschema
import pytest

from browser import dump_dom

REPORTS = "ProfilerReport/profiler-output/profiler-reports"
JOBS = ["rules-jatinbajaj-nlp-gpu-idle", "rules-mlops-summary-llm-4gpu"]
SUMMARIES = {"OverallSystemUsage", "OverallFrameworkMetrics"}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", *args], capture_output=True, text=True, timeout=300
    )


def valid(root, doc: dict) -> None:
    schema = json.loads((root / "schemas" / "trainprof-compare.schema.json").read_text())
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(schema).iter_errors(doc)
    )
    assert error is None, f"{error.message[:400]} at {list(error.absolute_path)}"


def reports_of(folder) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted((folder / REPORTS).glob("*.json"))}


@pytest.mark.parametrize("job", JOBS)
def test_a_folder_of_reports_only_shows_sagemakers_verdicts_alone(
    job, real_data, root, tmp_path, chromium
):
    folder = real_data / "real-sagemaker" / job
    page = tmp_path / "sagemaker.html"
    result = cli("compare", "--sagemaker", str(folder), "--json", "-", "-o", str(page))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    valid(root, doc)
    assert doc["kind"] == "sagemaker" and doc["sagemaker_only"] is True
    assert [r["label"] for r in doc["runs"]] == ["sagemaker"]
    assert any("shown alone" in n for n in doc["not_comparable"])
    reports = reports_of(folder)
    assert set(doc["rules"]) == set(reports) - SUMMARIES
    for rule, by_run in doc["rules"].items():
        theirs = reports[rule]
        verdict = by_run["sagemaker"]
        assert set(by_run) == {"sagemaker"}
        assert verdict["triggered"] == theirs["RuleTriggered"]
        assert verdict["datapoints"] == theirs["Datapoints"]
        expected = (
            "fired"
            if theirs["RuleTriggered"]
            else "no_data"
            if not theirs["Datapoints"]
            else "quiet"
        )
        assert verdict["status"] == expected, rule
    # What a person sees: the verdicts marked as SageMaker's alone, with how often each fired.
    dom = dump_dom(chromium, page)
    assert "SageMaker's verdicts alone" in dom
    fired = [r for r, v in reports.items() if v["RuleTriggered"] and r not in SUMMARIES]
    for rule in fired:
        assert f"×{reports[rule]['RuleTriggered']}" in dom, rule


def test_the_real_low_gpu_verdict_and_its_measure(real_data):
    folder = real_data / "real-sagemaker" / "rules-jatinbajaj-nlp-gpu-idle"
    doc = json.loads(cli("compare", "--sagemaker", str(folder), "--json", "-").stdout)
    low = doc["rules"]["LowGPUUtilization"]["sagemaker"]
    assert low["status"] == "fired" and low["triggered"] == 13
    assert low["parameters"]["threshold_p95"] == "70"
    assert low["measured"]["value"] == 0.0 and low["measured"]["threshold"] == 0.7
    cpu = doc["rules"]["CPUBottleneck"]["sagemaker"]["measured"]
    report = reports_of(folder)["CPUBottleneck"]
    assert cpu["value"] == pytest.approx(report["Violations"] / report["Datapoints"], abs=1e-4)
    usage = {(r["resource"], r["node"]): r for r in doc["system_usage"]}
    assert usage[("CPU", "algo-1")]["p95"] == 84.25


@pytest.fixture
def beside(real_data, tmp_path):
    """A job folder holding raw profiler data and ProfilerReport verdicts. No real job kept
    both, so this one puts a real job's system metrics (trimcrae-8xtt-redock) beside another
    real job's reports (jatinbajaj's, whose GPU idled too): the comparison does not know,
    and shows where they differ."""
    job = tmp_path / "job"
    shutil.copytree(
        real_data / "real-sagemaker" / "trimcrae-8xtt-redock" / "results", job / "results"
    )
    shutil.copytree(
        real_data / "real-sagemaker" / "rules-jatinbajaj-nlp-gpu-idle" / "ProfilerReport",
        job / "ProfilerReport",
    )
    for path in job.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return job


def test_sagemakers_verdicts_beside_trainprofs_with_why_they_differ(beside, root, promtool):
    result = cli("compare", "--sagemaker", str(beside), "--json", "-")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    valid(root, doc)
    assert [r["label"] for r in doc["runs"]] == ["sagemaker", "trainprof"]
    assert doc["sagemaker_only"] is False
    both = {r: v for r, v in doc["rules"].items() if set(v) == {"sagemaker", "trainprof"}}
    assert {"LowGPUUtilization", "CPUBottleneck", "BatchSize", "LoadBalancing"} <= set(both)
    differ = {r for r, v in both.items() if v["sagemaker"]["status"] != v["trainprof"]["status"]}
    assert {d["rule"] for d in doc["disagreements"]} == differ
    assert all(d["reason"] for d in doc["disagreements"])
    # One GPU: trainprof says LoadBalancing does not apply; SageMaker said quiet.
    balancing = next(d for d in doc["disagreements"] if d["rule"] == "LoadBalancing")
    assert "needs 2 GPUs on a node" in balancing["reason"]
    # Both found the GPU idle.
    assert both["LowGPUUtilization"]["trainprof"]["status"] == "fired"
    assert "parameters SageMaker ran with" in " ".join(doc["notes"])


def test_trainprof_replays_with_sagemakers_parameters(beside, promtool):
    """The same job with CPUBottleneck's threshold and patience lowered in SageMaker's report:
    trainprof's verdict follows the parameters SageMaker ran with."""
    before = json.loads(cli("compare", "--sagemaker", str(beside), "--json", "-").stdout)
    assert before["rules"]["CPUBottleneck"]["trainprof"]["status"] == "quiet"
    path = beside / REPORTS / "CPUBottleneck.json"
    report = json.loads(path.read_text())
    parameters = report["RuleParameters"].replace("threshold:50", "threshold:20")
    report["RuleParameters"] = parameters.replace("patience:1000", "patience:100")
    path.write_text(json.dumps(report))
    after = json.loads(cli("compare", "--sagemaker", str(beside), "--json", "-").stdout)
    assert after["rules"]["CPUBottleneck"]["trainprof"]["status"] == "fired"
    assert after["rules"]["CPUBottleneck"]["trainprof"]["measured"]["threshold"] == 0.2


def test_damaged_reports_are_skipped_and_named(real_data, tmp_path):
    folder = tmp_path / "job"
    shutil.copytree(real_data / "real-sagemaker" / "rules-mlops-summary-llm-4gpu", folder)
    reports = folder / REPORTS
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (reports / "StepOutlier.json").write_text('{"RuleTriggered": 1, "Datap')
    (reports / "BatchSize.json").write_text('{"RuleTriggered": -3, "Datapoints": 1}')
    (reports / "IOBottleneck.json").write_bytes(b"\xff\xfe binary")
    result = cli("compare", "--sagemaker", str(folder), "--json", "-")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert {"StepOutlier", "BatchSize", "IOBottleneck"}.isdisjoint(doc["rules"])
    assert {"LowGPUUtilization", "CPUBottleneck"} <= set(doc["rules"])
    note = next(n for n in doc["notes"] if n.startswith("skipped 3 unreadable report(s)"))
    assert "StepOutlier.json" in note and "RuleTriggered is -3" in note
    assert "IOBottleneck.json" in note


def test_replay_points_a_folder_of_reports_at_compare(real_data):
    folder = real_data / "real-sagemaker" / "rules-mlops-summary-llm-4gpu"
    result = cli("replay", str(folder))
    assert result.returncode == 2
    assert f"trainprof compare --sagemaker {folder} shows them" in result.stderr

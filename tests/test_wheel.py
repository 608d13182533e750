"""The wheel, installed with only `[all]` into a clean virtual environment, runs every
documented command from there, as a user who ran `pip install 'trainprof[all]'` would.

The environment is made without pip (`venv --without-pip`) and filled by this session's pip
(`pip --python`), from the package index and cache pip is configured with; nothing from the
checkout is importable there (no editable install, no PYTHONPATH, the commands run in an
empty directory), and neither the test extra nor any framework is installed. Each command
runs from the environment's own `trainprof` script (the exporter's also as `python -m
trainprof`), and its output is checked with the real tools where one exists (promtool,
amtool, helm).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from test_export import _tree
from trainprof.contract import metrics

pytestmark = pytest.mark.tools

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SAGEMAKER_JOB = DATA / "real-sagemaker" / "trimcrae-8xtt-redock"
TRACE = DATA / "real-gpu-traces" / "mi250-toy-train.pt.trace.json.gz"
# The series of the exporter's host collectors, which every host has.
EXPORTED = {
    name
    for m in metrics.METRICS
    if m.source == "exporter" and m.collector in ("exporter", "cpu", "memory")
    for name in metrics.series_names(m)
}
VERSION = re.search(r'__version__ = "([^"]+)"', (ROOT / "src/trainprof/_version.py").read_text())


class Installed:
    """The virtual environment and how to run a command in it."""

    def __init__(self, venv: Path, work: Path, env: dict[str, str]):
        self.venv, self.work, self.env = venv, work, env
        self.python = str(venv / "bin" / "python")
        self.trainprof = str(venv / "bin" / "trainprof")

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.trainprof, *args],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, argv: list[str], log: Path) -> subprocess.Popen:
        with open(log, "wb") as err:
            return subprocess.Popen(argv, cwd=self.work, env=self.env, stderr=err)


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Installed:
    top = tmp_path_factory.mktemp("installed")
    venv = top / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install"]
        + ["--disable-pip-version-check", "-q", f"trainprof[all] @ {wheel.as_uri()}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr
    work = top / "work"
    work.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("TRAINPROF_")
    }
    path = [p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(sys.prefix)]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    return Installed(venv, work, env)


def test_the_environment_holds_the_wheel_and_all_and_nothing_else(installed, wheel):
    code = (
        "import importlib.metadata as m, importlib.util as u, json, trainprof\n"
        "print(json.dumps([trainprof.__file__, sorted(d.metadata['Name'].lower() "
        "for d in m.distributions()), [n for n in ('torch', 'pytest', 'lightning', "
        "'transformers', 'keras', 'xgboost', 'hypothesis') if u.find_spec(n)]]))"
    )
    done = subprocess.run(
        [installed.python, "-c", code], cwd=installed.work, env=installed.env,
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    where, names, frameworks = json.loads(done.stdout)
    assert where.startswith(str(installed.venv)) and "site-packages" in where
    assert frameworks == []
    assert {"trainprof", "numpy", "psutil", "nvidia-ml-py", "pyyaml", "bcrypt"} <= set(names)
    assert "pip" not in names
    assert wheel.name == f"trainprof-{VERSION.group(1)}-py3-none-any.whl"


def test_version_from_the_script_and_from_python_m(installed):
    assert installed.run("--version").stdout == f"trainprof {VERSION.group(1)}\n"
    done = subprocess.run(
        [installed.python, "-m", "trainprof", "--version"],
        cwd=installed.work, env=installed.env, capture_output=True, text=True,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, f"trainprof {VERSION.group(1)}\n")


def test_rules_compile_validate_and_list(installed, promtool):
    work = installed.work
    (work / "rules.yaml").write_text(
        "rules:\n  - rule: ProfilerReport\n    parameters: {CPUBottleneck_threshold: 30}\n"
    )
    assert "LowGPUUtilization" in installed.run("rules", "list").stdout
    done = installed.run("rules", "compile", "-o", "compiled")
    assert done.returncode == 0, done.stderr
    done = installed.run(
        "rules", "compile", "-c", "rules.yaml", "-o", "operator", "--format", "prometheusrule",
        "--namespace", "monitoring", "--label", "release=kube-prometheus-stack",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (rules,) = (work / "compiled").glob("*.yaml")
    check = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True)
    assert check.returncode == 0, check.stdout
    (resource,) = (work / "operator").glob("*.yaml")
    resource = yaml.safe_load(resource.read_text())
    assert resource["kind"] == "PrometheusRule"
    assert resource["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    done = installed.run("rules", "validate", "-c", "rules.yaml")
    assert done.returncode == 0 and "CPUBottleneck" in done.stdout, done.stderr
    (work / "bad.yaml").write_text("rules:\n  - rule: CPUBottleneckk\n")
    done = installed.run("rules", "validate", "-c", "bad.yaml")
    assert done.returncode == 2 and "CPUBottleneckk" in done.stderr
    assert "Traceback" not in done.stderr


def test_replay_and_report_of_a_real_sagemaker_job(installed, promtool):
    done = installed.run("replay", str(SAGEMAKER_JOB), "--json", "-")
    assert done.returncode == 0, done.stderr
    rules = json.loads(done.stdout)["rules"]
    assert rules["LowGPUUtilization"]["fired"]  # the GPU idled for most of the job
    assert not rules["CPUBottleneck"]["fired"]
    done = installed.run("report", "--replay", str(SAGEMAKER_JOB), "-o", "sagemaker.html")
    assert done.returncode == 0, done.stderr
    page = (installed.work / "sagemaker.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "LowGPUUtilization" in page
    assert re.search(r"1 of \d+ rules fired", done.stderr)


def test_a_tensor_trial_without_torch_names_the_torch_extra(installed, tmp_path):
    """`[all]` has no torch (a CUDA build of several GB on PyPI): the one command that needs
    it says so in one line."""
    import numpy as np

    from smdebug_writer import write_trial

    steps = {i: {"CrossEntropyLoss_output_0": np.float32(1.0 - i / 10)} for i in range(3)}
    trial = write_trial(tmp_path / "job" / "debug-output", steps)
    for argv in (["replay", str(trial)], ["report", "--replay", str(trial), "-o", "t.html"]):
        done = installed.run(*argv)
        assert (done.returncode, done.stderr) == (
            2,
            "error: replaying a SageMaker Debugger tensor trial needs torch, which is not "
            "installed: pip install 'trainprof[torch]'\n",
        )
    done = subprocess.run(
        [installed.python, "-c", "import trainprof.torch"],
        cwd=installed.work, env=installed.env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.stderr.splitlines()[-1] == (
        "trainprof.extras.MissingExtra: trainprof.torch.watch() needs torch, which is not "
        "installed: pip install 'trainprof[torch]'"
    )


def _serving(process: subprocess.Popen, log: Path) -> str:
    """The /metrics URL the exporter logs once it serves."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"serving (http://\S+/metrics)", log.read_text(errors="replace"))
        if found:
            return found.group(1)
        assert process.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError(f"the exporter did not start:\n{log.read_text()}")


def _stop(process: subprocess.Popen) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_exporter_answers_a_scrape_and_a_recording_replays(installed, promtool):
    """`trainprof record` (the exporter, recording) and `python -m trainprof exporter`, side
    by side; each answers one scrape, and the recording replays."""
    work = installed.work
    listen = ["--web.listen-address", "127.0.0.1:0", "--datapoint-interval", "0.1s"]
    recorder = installed.start(
        [installed.trainprof, "record", "run.jsonl.gz", *listen], work / "record.log"
    )
    exporter = installed.start(
        [installed.python, "-m", "trainprof", "exporter", *listen], work / "exporter.log"
    )
    try:
        for process, log in ((recorder, "record.log"), (exporter, "exporter.log")):
            url = _serving(process, work / log)
            time.sleep(0.5)  # a few samples
            with urllib.request.urlopen(url, timeout=10) as response:
                body = response.read().decode()
            check = subprocess.run(
                [promtool, "check", "metrics"], input=body, capture_output=True, text=True
            )
            assert check.returncode == 0, check.stderr
            served = set(re.findall(r"^([A-Za-z_:][\w:]*)", body, re.M))
            assert EXPORTED - served == set()
            build = metrics.metric("trainprof_exporter_build_info").name
            assert re.search(rf'^{build}{{[^}}]*version="{VERSION.group(1)}"', body, re.M)
    finally:
        codes = [_stop(recorder), _stop(exporter)]
    assert codes == [0, 0], (work / "record.log").read_text() + (work / "exporter.log").read_text()
    with gzip.open(work / "run.jsonl.gz", "rt") as f:
        assert json.loads(f.readline())["kind"] == "meta"
    done = installed.run("replay", "run.jsonl.gz", "--json", "-")
    assert done.returncode == 0, done.stderr
    assert "CPUBottleneck" in json.loads(done.stdout)["rules"]


def test_trace_summarize_and_report_of_a_trace(installed):
    done = installed.run("trace", "summarize", str(TRACE), "--json", "-")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary and "Traceback" not in done.stderr
    done = installed.run("trace", "summarize", str(TRACE), "--top", "2")
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    done = installed.run("report", "--trace", str(TRACE), "-o", "kernels.html")
    assert done.returncode == 0, done.stderr
    assert (installed.work / "kernels.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize(
    "kind, committed",
    [("rules", "rules"), ("dashboards", "dashboards"), ("alerting", "alerting"), ("chart", "helm")],
)
def test_export_writes_what_the_repository_commits(installed, kind, committed):
    out = installed.work / f"export-{kind}"
    done = installed.run("export", kind, "-o", str(out))
    assert done.returncode == 0, done.stderr
    want = {
        path: text
        for path, text in _tree(ROOT / committed).items()
        if "Code generated by" in text[:400]
    }
    assert want and _tree(out) == want


def test_the_exported_chart_and_alerting_pass_their_tools(installed, helm, amtool):
    chart = installed.work / "export-chart" / "trainprof"
    if not chart.is_dir():
        assert installed.run("export", "chart", "-o", str(chart.parent)).returncode == 0
    homes = {
        f"HELM_{k}_HOME": str(installed.work / f"helm-{k}") for k in ("CACHE", "CONFIG", "DATA")
    }
    env = {**installed.env, **homes}
    lint = subprocess.run([helm, "lint", "--strict", str(chart)], env=env, capture_output=True)
    assert lint.returncode == 0, lint.stdout
    alerting = installed.work / "export-alerting"
    if not alerting.is_dir():
        assert installed.run("export", "alerting", "-o", str(alerting)).returncode == 0
    check = subprocess.run(
        [amtool, "check-config", str(alerting / "alertmanager.example.yml")], capture_output=True
    )
    assert check.returncode == 0, check.stdout


def test_actions_check_and_rbac(installed):
    work = installed.work
    (work / "actions.yaml").write_text(
        "dry_run: true\ntoken_env: TRAINPROF_ACTIONS_TOKEN\n"
        f"audit_log: {work / 'audit.jsonl'}\n"
        "allow: {namespaces: [team-a], training_jobs: ['bert-.*']}\n"
        "rules: {CPUBottleneck: stop}\n"
        "kubernetes: {resource: Job, action: suspend, api_url: 'https://127.0.0.1:6443'}\n"
    )
    installed.env["TRAINPROF_ACTIONS_TOKEN"] = "t" * 32
    try:
        done = installed.run("actions", "check", "-c", "actions.yaml")
        assert done.returncode == 0, done.stderr
        done = installed.run("actions", "rbac", "-c", "actions.yaml")
        assert done.returncode == 0 and "kind: Role" in done.stdout, done.stderr
    finally:
        del installed.env["TRAINPROF_ACTIONS_TOKEN"]

"""`trainprof stack`: the local Prometheus, Alertmanager and exporter for a training script.

A real tiny script (tests/fixtures/stack/train_tiny.py) runs under the stack: it trains
until the stack's Prometheus has scraped its steps and the exporter, and says what it saw.
Then the stack alone (`trainprof stack`) keeps running until Ctrl-C, and bad input ends
with exit 2 and one line.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "fixtures" / "stack" / "train_tiny.py"
pytestmark = pytest.mark.tools


def _stack(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainprof", "stack", *args]


def _gone(url: str) -> bool:
    try:
        urllib.request.urlopen(f"{url}/-/ready", timeout=2)
    except (urllib.error.URLError, OSError):
        return True
    return False


def test_a_training_script_runs_under_the_stack_and_prometheus_scrapes_it(
    tmp_path, prometheus_bin, alertmanager_bin
):
    report = tmp_path / "report.html"
    result = subprocess.run(
        _stack("--dir", str(tmp_path / "stack"), "--report", str(report))
        + ["--", sys.executable, str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    seen = json.loads(_last_json(out))
    (rank,) = seen["steps"]
    # The rank announced itself through file_sd with the stack's job and node, once each.
    assert rank["training_job"] == "train_tiny" and rank["job"] == "trainprof-training"
    assert rank["rank"] == "0" and rank["instance"].startswith("127.0.0.1:")
    assert not [k for k in rank if k.startswith("exported_")], rank
    assert seen["exporter"] and seen["exporter"][0]["job"] == "trainprof"
    assert seen["rule_groups"] >= 10 and seen["alerting_rules"] >= 10
    assert seen["alertmanager_ready"] is True
    prometheus = re.search(r"Prometheus +(http://127\.0\.0\.1:\d+)", out).group(1)
    assert "at a 1s scrape" in out
    assert "exited with 0" in out and "alerts notified:" in out
    rules = (tmp_path / "stack" / "rules.yaml").read_text()
    assert "trainprof.LowGPUUtilization" in rules
    assert "train_tiny" in report.read_text()
    assert _gone(prometheus), "Prometheus still answers after the stack ended"


def _last_json(out: str) -> str:
    return [line for line in out.splitlines() if line.startswith("{")][-1]


def test_the_stack_alone_keeps_running_until_ctrl_c(tmp_path, prometheus_bin, alertmanager_bin):
    proc = subprocess.Popen(
        _stack("--dir", str(tmp_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "press Ctrl-C" in line:
                break
        text = "".join(lines)
        prometheus = re.search(r"Prometheus +(http://127\.0\.0\.1:\d+)", text).group(1)
        alertmanager = re.search(r"Alertmanager +(http://127\.0\.0\.1:\d+)", text).group(1)
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(f"{prometheus}/api/v1/query?query=up", timeout=5) as r:
                up = {s["metric"]["job"]: s["value"][1] for s in json.load(r)["data"]["result"]}
            if up.get("trainprof") == "1":
                break
            assert time.monotonic() < deadline, up
            time.sleep(0.5)
        assert not _gone(alertmanager)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, text + rest
    assert "alerts notified: none" in rest
    assert _gone(prometheus) and _gone(alertmanager)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--", "no-such-trainer"], "cannot run 'no-such-trainer': no such command"),
        (["-c", "{missing}", "--", "true"], "missing.yaml"),
        (["--scrape-interval", "soon"], "soon"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, tmp_path):
    args = [a.replace("{missing}", str(tmp_path / "missing.yaml")) for a in args]
    result = subprocess.run(_stack(*args), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_report_that_cannot_be_made_is_said_and_fails_the_run(
    tmp_path, prometheus_bin, alertmanager_bin
):
    """A script that never calls trainprof.start() leaves nothing to report on."""
    result = subprocess.run(
        _stack("--report", str(tmp_path / "report.html"), "--", sys.executable, "-c", "pass"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error: no report: no trainprof series with training_job='local'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "report.html").exists()

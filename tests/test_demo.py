"""`make demo` runs end to end: real Prometheus and Alertmanager, the exporter, a training
loop; the starved act pages CPUBottleneck and the alerts reach the webhook; no alert flaps,
and the fixed act ends quiet or the demo says why each alert still fires."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest


def test_the_demo_pages_on_the_starved_input_pipeline(tmp_path, prometheus_bin, alertmanager_bin):
    """With --keep (make demo KEEP=1) the stack stays up at the end, until Ctrl-C."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainprof.demo", "--duration", "90", "--out", str(tmp_path)]
        + ["--keep"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        for line in proc.stdout:
            lines.append(line)
            if "Press Ctrl-C" in line or time.monotonic() > deadline:
                break
        kept = "".join(lines)
        urls = dict(re.findall(r"^  (Prometheus|Alertmanager) +(http://\S+?)/", kept, re.M)[-2:])
        assert set(urls) == {"Prometheus", "Alertmanager"}, kept
        with urllib.request.urlopen(f"{urls['Prometheus']}/api/v1/query?query=up", timeout=5) as r:
            up = {s["metric"]["job"]: s["value"][1] for s in json.load(r)["data"]["result"]}
        assert up == {"trainprof": "1", "trainprof-training": "1"}, up
        with urllib.request.urlopen(f"{urls['Alertmanager']}/-/ready", timeout=5) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, kept + rest
    out = kept + rest
    for url in urls.values():
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{url}/-/ready", timeout=2)
    assert "FIRING   TrainingCPUBottleneck [critical]" in out, out
    assert "-> page    FIRING   TrainingCPUBottleneck (job demo)" in out, out
    assert "FIRING   TrainingLowGPUUtilization [warning] reason=underutilized" in out, out
    # one alert for the job, its description counting the GPUs
    assert "Job demo: 1 of 1 GPUs were underutilized" in out, out
    # No flapping: each alert (rule and reason) fires at most once in the whole demo.
    fired = re.findall(r"FIRING   (\S+) \[\w+\](?: reason=(\S+))?", out)
    assert fired and len(fired) == len(set(fired)), fired
    # The fixed act ends quiet, or the demo says why each alert still fires.
    end = out.split("act 2:")[1]
    if "the fixed job ends quiet" not in end:
        still = end.split("still firing at the end, and why:")[1]
        lines = re.findall(r"^\[\d\d:\d\d\]   Training.*$", still, re.MULTILINE)
        reasons = ("act 2 still checkpoints", "counts the slow steps", "act 2 began")
        assert lines and all(any(r in line for r in reasons) for line in lines), still
    # While the job is CPU-bottlenecked (act 1), the underused GPU follows from the bottleneck:
    # Alertmanager inhibits it, so no notification names it.
    act1 = out.split("act 2:")[0]
    assert not [
        line
        for line in act1.splitlines()
        if "-> notify" in line and "TrainingLowGPUUtilization" in line
    ], act1
    assert (tmp_path / "rules.yaml").exists()
    report = (tmp_path / "report.html").read_text()
    # The report's rules table marks the rule that paged as fired, with a count and a time.
    row = re.search(r'<tr class="main( fired)?" data-rule="CPUBottleneck">(.*?)</tr>', report)
    assert row and row.group(1) == " fired", row and row.group(0)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(2))
    assert int(cells[3]) >= 1 and cells[4] not in ("", "-"), cells

"""`make demo` runs end to end: real Prometheus and Alertmanager, the exporter, a training
loop; the starved act pages CPUBottleneck and the alerts reach the webhook; no alert flaps,
and the fixed act ends quiet or the demo says why each alert still fires."""

from __future__ import annotations

import re
import subprocess
import sys


def test_the_demo_pages_on_the_starved_input_pipeline(tmp_path, prometheus_bin, alertmanager_bin):
    result = subprocess.run(
        [sys.executable, "-m", "trainprof.demo", "--duration", "90", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
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

"""`make demo` runs end to end: real Prometheus and Alertmanager, the exporter, a training
loop; the starved act pages CPUBottleneck and the alerts reach the webhook."""

from __future__ import annotations

import re
import subprocess
import sys


def test_the_demo_pages_on_the_starved_input_pipeline(tmp_path, prometheus_bin, alertmanager_bin):
    result = subprocess.run(
        [sys.executable, "-m", "trainprof.demo", "--duration", "50", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "FIRING   TrainingCPUBottleneck [critical]" in out, out
    assert "-> page    FIRING   TrainingCPUBottleneck (job demo)" in out, out
    assert "FIRING   TrainingLowGPUUtilization [warning] gpu=0 reason=underutilized" in out, out
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

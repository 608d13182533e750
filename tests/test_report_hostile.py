"""Label values no one expects, in a real browser: tabs, backslashes, format characters
(a right-to-left override, a zero-width space), printf and str.format markers, and a long
unbroken name. The report shows them as they are and keeps its columns on the page."""

from __future__ import annotations

import re
import subprocess
import sys

from trainprof.contract import recording
from trainprof.contract.sampling import GpuSample, HostSample
from trainprof.report.format import visible

from browser import _run, dump_dom

START = 1_700_000_000
NODE = "tab\there back\\slash %s {0} \u202eevil\u200b " + "n" * 160
WIDTH = 1000

MEASURE = """
<script>
const doc = document.documentElement;
const over = [...document.querySelectorAll('table')].filter(
  t => t.getBoundingClientRect().right > doc.clientWidth + 1);
document.body.setAttribute('data-measured',
  JSON.stringify({scroll: doc.scrollWidth, client: doc.clientWidth, tables: over.length}));
</script>
"""


def _recording(path):
    with recording.open_recording(str(path), "w") as stream:
        writer = recording.Writer(stream)
        writer.write(recording.meta(0.5, "test"))
        for k in range(1, 12 * 120 + 1):
            sample = HostSample(
                START + k * 0.5,
                cpu_utilization=[0.3, 0.3],
                cpu_iowait=[0.0, 0.0],
                memory_used_ratio=0.3,
                gpus=[GpuSample(0, "gpu0", utilization=0.02, memory_used_ratio=0.5)],
            )
            writer.write(recording.host_record(NODE, sample))


def test_hostile_label_values_read_as_they_are_and_stay_on_the_page(tmp_path, promtool, chromium):
    _recording(tmp_path / "rec.jsonl")
    out = tmp_path / "report.html"
    result = subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "report", "--replay", str(tmp_path / "rec.jsonl")]
        + ["-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    text = re.sub(r"<[^>]+>", "", dump_dom(chromium, out))
    import html

    text = html.unescape(text)
    shown = visible(NODE)
    assert "\\t" in shown and "\\u202e" in shown and "\\u200b" in shown
    assert text.count(shown) >= 3, "the node, escaped as text, in legends and tables"
    assert "\u202e" not in text and "\u200b" not in text

    measured = tmp_path / "measured.html"
    page = out.read_text()
    page = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page)
    measured.write_text(page.replace("</body>", MEASURE + "</body>"))
    run = _run(chromium, f"--window-size={WIDTH},2000", "--dump-dom", measured.as_uri())
    found = re.search(r"data-measured=\"([^\"]*)\"", run.stdout)
    assert found, run.stderr[-2000:]
    numbers = html.unescape(found.group(1))
    import json

    layout = json.loads(numbers)
    assert layout["tables"] == 0, layout
    assert layout["scroll"] <= layout["client"], layout

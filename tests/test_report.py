"""`trainprof report`: one self-contained HTML file with SageMaker's sections, checked in a
real browser (headless Chromium): every section, every rule that fired, hostile names shown
and never run, nothing fetched."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import yaml

from trainprof.contract import recording
from trainprof.contract.sampling import GpuSample, HostSample
from trainprof.dashboards.alerts import times_triggered
from trainprof.dashboards.queries import JOB_VARIABLES, Scope, interpolate
from trainprof.replay.synthetic import write_system
from trainprof.report import from_prometheus
from trainprof.report.queries import grafana_builtins
from trainprof.rules.config import alerting

from browser import dump_dom, measured, pixels, screenshot
from servers import get_json, wait_for_firing

SECTIONS = [
    "training-job-summary",
    "system-usage-statistics",
    "framework-metrics-summary",
    "rules-summary",
    "rule-details",
]
HOSTILE_JOB = "<script>alert(\"job\")</script> {{x}} 'q' & }"
START = 1_700_000_000

# One node whose GPU 0 starves while a core is saturated and another waits on I/O; its
# GPU memory jumps after 12 minutes. GPU 1 is busy.
STARVED = {
    "algo-1": {
        "cores": 4,
        "gpus": 2,
        "timeline": [
            {
                "gpu_util": [0.03, 0.9],
                "gpu_mem": [0.3, 0.5],
                "cpu": [0.97, 0.3, 0.3, 0.3],
                "iowait": [0.0, 0.7, 0.0, 0.0],
            },
            {
                "from": "12m",
                "gpu_util": [0.03, 0.9],
                "gpu_mem": [0.6, 0.5],
                "cpu": [0.97, 0.3, 0.3, 0.3],
                "iowait": [0.0, 0.7, 0.0, 0.0],
            },
        ],
    }
}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", *args], capture_output=True, text=True, timeout=300
    )


class Dom(HTMLParser):
    """What the tests look at in a rendered page."""

    def __init__(self, text: str):
        super().__init__()
        self.ids, self.h2, self.articles, self.scripts = [], [], [], 0
        self.rule_rows: dict[str, list[str]] = {}
        self.external: list[str] = []
        self._h2 = self._row = None
        self._cells: list[str] = []
        self.text = ""
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.ids.append(a.get("id"))
        if tag == "article":
            self.articles.append(a.get("id"))
        if tag == "script":
            self.scripts += 1
        if tag == "h2":
            self._h2 = ""
        if tag == "tr" and "data-rule" in a:
            self._row, self._cells = a["data-rule"], []
        if tag == "td" and self._row is not None:
            self._cells.append("")
        for name in ("src", "href"):
            if name in a and not a[name].startswith("#"):
                self.external.append(f"{tag} {name}={a[name]}")

    def handle_endtag(self, tag):
        if tag == "h2" and self._h2 is not None:
            self.h2.append(self._h2.strip())
            self._h2 = None
        if tag == "tr" and self._row is not None:
            self.rule_rows[self._row] = [c.strip() for c in self._cells]
            self._row = None

    def handle_data(self, data):
        self.text += data
        if self._h2 is not None:
            self._h2 += data
        if self._row is not None and self._cells:
            self._cells[-1] += data


@pytest.fixture(scope="module")
def replayed(tmp_path_factory, promtool):
    """A SageMaker-layout job replayed into a report, and `trainprof replay`'s verdicts."""
    tmp = tmp_path_factory.mktemp("report")
    source = tmp / "job" / "profiler-output"
    write_system(str(source), start=START, duration=16 * 60, interval=0.5, hosts=STARVED)
    out = tmp / "report.html"
    result = cli("report", "--replay", str(tmp / "job"), "--job", HOSTILE_JOB, "-o", str(out))
    assert result.returncode == 0, result.stderr
    verdicts = cli("replay", str(tmp / "job"), "--job", HOSTILE_JOB, "--json", "-")
    assert verdicts.returncode == 0, verdicts.stderr
    return out, json.loads(verdicts.stdout)["rules"]


def test_the_report_shows_every_section_and_each_rule_that_fired(replayed, chromium):
    page, verdicts = replayed
    dom = Dom(dump_dom(chromium, page))
    assert dom.ids == SECTIONS
    assert dom.h2 == [
        "Training job summary",
        "System usage statistics",
        "Framework metrics summary",
        "Rules summary",
        "Rules that fired",
    ]
    fired = {rule for rule, v in verdicts.items() if v["fired"]}
    assert {"CPUBottleneck", "IOBottleneck", "LowGPUUtilization", "GPUMemoryIncrease"} <= fired
    assert set(dom.articles) == {f"rule-{rule}" for rule in fired}
    for rule, v in verdicts.items():
        if rule in dom.rule_rows:
            assert dom.rule_rows[rule][3] == str(len(v["alerts"])), rule
    # One alert per job and reason; the GPUs each found are listed in its rule's detail.
    for rule in fired:
        found = verdicts[rule]["affected"]
        assert found and f"Found ({len(found)})" in dom.text, rule
    assert set(dom.rule_rows) == {
        r for r in verdicts if r not in ("OverallSystemUsage", "OverallFrameworkMetrics")
    }


def test_hostile_names_are_shown_as_text_and_never_run(replayed, chromium):
    page, _ = replayed
    dom = Dom(dump_dom(chromium, page))
    assert dom.scripts == 0
    assert HOSTILE_JOB in dom.text
    assert "<script>" not in page.read_text()


def test_hostile_label_values_reach_legends_and_alert_tables_escaped(tmp_path, promtool, chromium):
    """A node named like markup (a trainprof recording may name nodes anything) shows up in
    chart legends and in the fired rule's alert table as text."""
    node = 'n"1<img src=x onerror=alert(1)>{{gpu}}'
    path = tmp_path / "rec.jsonl"
    with recording.open_recording(str(path), "w") as stream:
        writer = recording.Writer(stream)
        writer.write(recording.meta(0.5, "test"))
        for k in range(1, 12 * 120 + 1):
            writer.write(
                recording.host_record(
                    node,
                    HostSample(
                        START + k * 0.5,
                        cpu_utilization=[0.3, 0.3],
                        cpu_iowait=[0.0, 0.0],
                        memory_used_ratio=0.3,
                        gpus=[GpuSample(0, "gpu0", utilization=0.02, memory_used_ratio=0.5)],
                    ),
                )
            )
    out = tmp_path / "report.html"
    result = cli("report", "--replay", str(path), "-o", str(out))
    assert result.returncode == 0, result.stderr
    dom = Dom(dump_dom(chromium, out))
    assert "rule-LowGPUUtilization" in dom.articles
    assert dom.text.count(node) >= 3  # legends, the alert table
    assert not dom.external and dom.scripts == 0
    assert "<img" not in out.read_text()


def test_the_report_fetches_nothing(replayed):
    page, _ = replayed
    text = page.read_text()
    dom = Dom(text)
    assert not dom.external
    assert not re.search(r"url\(|@import|<link|<img|<iframe|<object", text)
    assert "default-src 'none'" in text


# Each chart's place on the page and the colours of its data marks (series lines, points,
# the bars of the rule timeline); the axes, grid and labels are not data.
CHARTS = """
const charts = [...document.querySelectorAll('svg.chart')].map(svg => {
  const r = svg.getBoundingClientRect();
  const marks = [...svg.querySelectorAll('polyline, circle, rect[fill]:not([fill-opacity])')];
  return {label: svg.getAttribute('aria-label'),
          box: [r.left + scrollX, r.top + scrollY, r.right + scrollX, r.bottom + scrollY],
          colors: marks.map(m => m.getAttribute(m.tagName === 'polyline' ? 'stroke' : 'fill'))};
});
document.body.setAttribute('data-measured', JSON.stringify(
  {height: document.documentElement.scrollHeight, ratio: devicePixelRatio, charts}));
"""


def test_a_screenshot_of_the_report_shows_every_chart_drawn(replayed, chromium, tmp_path):
    """In a screenshot of the whole page, each chart's box holds the colours of its own data
    marks: the lines and bars a person reads, not just the axes, grid and labels."""
    page, _ = replayed
    height = measured(chromium, page, CHARTS, 1200, 2000)["height"]
    layout = measured(chromium, page, CHARTS, 1200, height)
    assert layout["ratio"] == 1 and len(layout["charts"]) >= 10, layout
    image = pixels(screenshot(chromium, page, tmp_path / "report.png", 1200, height))
    assert image.shape[:2] == (height, 1200)
    for chart in layout["charts"]:
        colors = {c for c in chart["colors"] if re.fullmatch(r"#[0-9a-f]{6}", c)}
        assert colors and len(colors) == len(set(chart["colors"])), chart
        left, top, right, bottom = (round(v) for v in chart["box"])
        assert right - left >= 300 and bottom - top >= 100, chart  # shown, at a readable size
        drawn = sum(painted(image[top:bottom, left:right], c) for c in colors)
        # A series across the plot paints several hundred pixels of its colour (a line 1.6 px
        # wide); a chart whose marks are empty or unpainted, a fraction of that.
        assert drawn >= (right - left) // 2, f"{chart['label']!r}: {drawn} pixels of {colors}"


def painted(box, color: str) -> int:
    """How many pixels of `box` show `color` laid at least 30 % opaque on the white page:
    an anti-aliased line's pixels are blends of its colour and the background."""
    ink = 255 - np.array([int(color[i : i + 2], 16) for i in (1, 3, 5)], dtype=float)
    away = 255 - box[..., :3].astype(float)  # each pixel's distance from white
    alpha = away @ ink / (ink @ ink)
    off = np.linalg.norm(away - alpha[..., None] * ink, axis=-1)
    return int(((alpha >= 0.3) & (off <= 32)).sum())


def test_the_prometheus_report_counts_what_the_dashboard_counts(live_job, tmp_path, chromium):
    base, live, config = live_job
    from conftest import LIVE_RULES

    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(LIVE_RULES))
    firing = wait_for_firing(
        base,
        {
            "CPUBottleneck",
            "IOBottleneck",
            "LowGPUUtilization",
            "BatchSize",
            "LoadBalancing",
            "StepOutlier",
        },
    )
    out = tmp_path / "report.html"
    result = cli(
        "report",
        "--prometheus",
        base,
        "--job",
        live.training_job,
        "--rules",
        str(rules),
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    dom = Dom(dump_dom(chromium, out))
    assert dom.ids == SECTIONS
    assert firing <= {r for r, cells in dom.rule_rows.items() if int(cells[3])}

    collected = from_prometheus(base, live.training_job, config)
    scope = Scope(config, JOB_VARIABLES)
    values = {"training_job": live.training_job, "namespace": None}
    builtins = grafana_builtins(
        collected.end - collected.start, collected.step, config.scrape_interval
    )
    expr = interpolate(times_triggered(scope, alerting(config)), values, builtins)
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": collected.end})
    counted = {r["metric"]["rule"]: float(r["value"][1]) for r in get_json(url)["data"]["result"]}
    for rule, verdict in collected.verdicts.items():
        assert counted[rule] == len(verdict.alerts), rule


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--prometheus", "http://127.0.0.1:9", "--job", "x"], 1, "cannot reach Prometheus"),
        (["--prometheus", "not a url", "--job", "x"], 2, "is not an http(s) URL"),
        (["--prometheus", "http://127.0.0.1:9"], 2, "--job is required"),
        (["--replay", "/nonexistent/profiler-output"], 2, "no such file or directory"),
        (
            ["--prometheus", "http://127.0.0.1:9", "--job", "x", "--from", "yesterday"],
            2,
            "is not a time",
        ),
    ],
)
def test_bad_input_is_one_sentence_and_an_exit_code(tmp_path, args, code, message):
    result = cli("report", *args, "-o", str(tmp_path / "r.html"))
    assert (result.returncode, result.stdout) == (code, "")
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "r.html").exists()


def test_an_unknown_job_names_the_known_ones(live_job, tmp_path):
    base, live, _ = live_job
    result = cli(
        "report",
        "--prometheus",
        base,
        "--job",
        live.training_job + "x",
        "-o",
        str(tmp_path / "r.html"),
    )
    assert result.returncode == 2
    assert f"did you mean {live.training_job}?" in result.stderr


def test_an_unwritable_output_fails_cleanly(replayed, tmp_path):
    source = Path(replayed[0]).parent / "job"
    result = cli("report", "--replay", str(source), "-o", str(tmp_path / "no" / "r.html"))
    assert result.returncode == 1
    assert "cannot write" in result.stderr and "Traceback" not in result.stderr


def test_a_configuration_without_the_summary_rules_still_reports_its_rules(replayed, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n- rule: LowGPUUtilization\n- rule: MaxInitializationTime\n")
    out = tmp_path / "r.html"
    result = cli(
        "report",
        "--replay",
        str(Path(replayed[0]).parent / "job"),
        "--rules",
        str(rules),
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    dom = Dom(out.read_text())
    assert set(dom.rule_rows) == {"LowGPUUtilization", "MaxInitializationTime"}
    assert dom.ids == SECTIONS and "rule-LowGPUUtilization" in dom.articles


def test_a_bad_rule_configuration_is_reported_with_its_path(replayed, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n- rule: LowGPUUtilisation\n")
    result = cli(
        "report",
        "--replay",
        str(Path(replayed[0]).parent / "job"),
        "--rules",
        str(rules),
        "-o",
        str(tmp_path / "r.html"),
    )
    assert result.returncode == 2
    assert "did you mean LowGPUUtilization?" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_server_that_is_not_prometheus_is_a_clear_failure(live_job, tmp_path):
    _, live, _ = live_job
    exporter = f"http://{live.targets[0]}"
    result = cli("report", "--prometheus", exporter, "--job", "x", "-o", str(tmp_path / "r.html"))
    assert result.returncode == 1
    assert "did not answer like Prometheus" in result.stderr
    assert "Traceback" not in result.stderr

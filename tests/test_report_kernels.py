"""`trainprof report --trace`: the GPU kernels section, checked in headless Chromium, on the
real A100 and MI250 traces (the MI250 one given rank 1, as a second rank of the job)."""

from __future__ import annotations

import gzip
import json
import re
from html import unescape
from pathlib import Path

import pytest

from test_report import START, Dom, cli
from trainprof.replay.synthetic import write_system
from trainprof.trace import read_trace, summarize
from trainprof.trace.window import describe

from browser import dump_dom, screenshot

TRACES = Path(__file__).resolve().parent / "data" / "real-gpu-traces"
NCCL = TRACES / "a100-nccl-training.pt.trace.json.gz"
PANELS = [
    "GPU time by overlap class",
    "Top kernels by time (all ranks)",
    "Kernel precision",
    "GPU activity",
    "Step time distribution",
    "Annotation: ## backward ##",
]
TABLES = [
    "GPU active time per rank",
    "Top 15 kernels by time",
    "Top 15 kernels by launches",
    "GPU memory operations",
]


def as_rank(source: Path, rank: int, out: Path, rename: dict[str, str] | None = None) -> Path:
    doc = json.loads(gzip.decompress(source.read_bytes()))
    doc["distributedInfo"] = {"rank": rank}
    for e in doc["traceEvents"]:
        if rename and e.get("name") in rename:
            e["name"] = rename[e["name"]]
    out.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return out


class Headings(Dom):
    def __init__(self, text: str):
        self.h4: list[str] = []
        self.captions: list[str] = []
        self._h4 = self._caption = None
        super().__init__(text)

    def handle_starttag(self, tag, attrs):
        super().handle_starttag(tag, attrs)
        if tag == "h4":
            self._h4 = ""
        if tag == "caption":
            self._caption = ""

    def handle_endtag(self, tag):
        super().handle_endtag(tag)
        if tag == "h4" and self._h4 is not None:
            self.h4.append(self._h4.strip())
            self._h4 = None
        if tag == "caption" and self._caption is not None:
            self.captions.append(self._caption.strip())
            self._caption = None

    def handle_data(self, data):
        super().handle_data(data)
        if self._h4 is not None:
            self._h4 += data
        if self._caption is not None:
            self._caption += data


@pytest.fixture(scope="module")
def trace_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kernels")
    mi250 = as_rank(TRACES / "mi250-toy-train.pt.trace.json.gz", 1, tmp / "mi250.json.gz")
    bad = tmp / "cut.json"
    bad.write_text('{"traceEvents": [')
    out = tmp / "kernels.html"
    result = cli("report", "--trace", str(NCCL), str(mi250), str(bad), "-o", str(out))
    return out, result


def test_trace_only_report_has_the_profiler_panels(trace_report, chromium):
    page, result = trace_report
    assert result.returncode == 2  # one trace was unreadable: said, skipped, report written
    assert "cut.json: not valid JSON" in result.stderr and "Traceback" not in result.stderr
    dom = Headings(dump_dom(chromium, page))
    assert dom.ids == ["gpu-kernels"] and dom.h2 == ["GPU kernels"]
    for title in PANELS:
        assert title in dom.h4, title
    for caption in TABLES:
        assert any(c.startswith(caption) for c in dom.captions), caption
    assert "Skipped unreadable trace" in dom.text
    assert "CPU active (operators)" in dom.text and "GPU active time" in dom.text
    assert "AMD Radeon Graphics" in dom.text and "NVIDIA A100-PG509-200" in dom.text
    assert dom.scripts == 0 and not dom.external


def test_the_top_kernel_rows_are_the_summary_s(trace_report, chromium):
    page, _ = trace_report
    html = dump_dom(chromium, page)
    top = summarize(read_trace(NCCL))["top_kernels"]
    # the longest kernel, its time and launch count, as the by-time table's first row
    cells = re.findall(
        r"<tr><td>([^<]*)</td><td class=\"num\">([^<]*)</td>"
        r"<td class=\"num\">([^<]*)</td>",
        html[html.index("Top 15 kernels by time") :],
    )
    name, seconds, launches = cells[0]
    assert unescape(name) == top[0]["name"]
    assert (seconds, launches) == (f"{top[0]['seconds'] * 1e3:.0f} ms", str(top[0]["launches"]))
    text = Headings(html).text
    assert "Memcpy DtoD (Device -> Device)" in text and "Memcpy HtoD (Host -> Device)" in text


def test_a_hostile_kernel_name_is_shown_not_run(tmp_path, chromium):
    hostile = "<script>alert('k')</script>"
    trace = as_rank(
        TRACES / "mi250-toy-train.pt.trace.json.gz",
        0,
        tmp_path / "h.json.gz",
        rename={"Memcpy HtoD (Host -> Device)": "Memcpy HtoD " + hostile},
    )
    out = tmp_path / "h.html"
    result = cli("report", "--trace", str(trace), "-o", str(out))
    assert result.returncode == 0, result.stderr
    dom = Headings(dump_dom(chromium, out))
    assert dom.scripts == 0 and hostile in dom.text


def test_with_a_replay_the_section_joins_the_report(tmp_path, promtool, chromium):
    source = tmp_path / "job" / "profiler-output"
    write_system(
        str(source),
        start=START,
        duration=180,
        interval=0.5,
        hosts={
            "algo-1": {
                "cores": 2,
                "gpus": 1,
                "timeline": [{"gpu_util": [0.5], "gpu_mem": [0.3], "cpu": [0.3, 0.3]}],
            }
        },
    )
    out = tmp_path / "r.html"
    result = cli("report", "--replay", str(tmp_path / "job"), "--trace", str(NCCL), "-o", str(out))
    assert result.returncode == 0, result.stderr
    dom = Headings(dump_dom(chromium, out))
    assert dom.ids[-2:] == ["gpu-kernels", "rules-summary"]
    assert "GPU kernels" in dom.h2


def test_no_source_at_all_is_bad_input(tmp_path):
    result = cli("report", "-o", str(tmp_path / "x.html"))
    assert result.returncode == 2 and "--trace" in result.stderr


def test_a_screenshot_renders_the_section(trace_report, chromium, tmp_path):
    page, _ = trace_report
    png = screenshot(chromium, page, tmp_path / "k.png", 1200, 3000)
    assert len(png) > 50_000  # charts and tables drawn, not a blank page


@pytest.mark.parametrize("include_last_step", [False, True])
def test_the_section_says_which_window_it_summarized(tmp_path, chromium, include_last_step):
    out = tmp_path / "k.html"
    flags = ["--include-last-step"] if include_last_step else []
    result = cli("report", "--trace", str(NCCL), *flags, "-o", str(out))
    assert result.returncode == 0, result.stderr
    html = dump_dom(chromium, out)
    summary = summarize(read_trace(NCCL), include_last_step=include_last_step)
    text = Headings(html).text
    assert describe(summary["window"]) in text
    assert ("ProfilerStep#6) left out as HTA does" in text) is not include_last_step
    top = summary["top_kernels"][0]
    cells = re.findall(
        r"<tr><td>([^<]*)</td><td class=\"num\">([^<]*)</td><td class=\"num\">([^<]*)</td>",
        html[html.index("Top 15 kernels by time") :],
    )
    assert cells[0][1:] == (f"{top['seconds'] * 1e3:.0f} ms", str(top["launches"]))

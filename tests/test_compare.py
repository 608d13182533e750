"""`trainprof compare A B` on two replays: the JSON contract (checked against its schema),
the terminal table and the HTML report as a person sees it in a real browser (headless
Chromium): step time with its change judged against the runs' noise, where the phase time
moved, utilisation, every rule's verdict in each run with the changed ones marked, and bad
input as one sentence and exit 2."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import jsonschema
import pytest

import warm_cli
from browser import dump_dom, screenshot
from synthetic_runs import write_run

START = 1_780_000_000
RULES = """\
scrape_interval: 15s
rules:
- rule: ProfilerReport
"""
HOSTILE = 'bert<script>alert("x")</script>&"q'


def cli(*args: str) -> warm_cli.Run:
    """`python -m trainprof.cli ARGS` in a process of its own (forked with torch imported)."""
    return warm_cli.run(*args, timeout=300)


def schema(root) -> jsonschema.Draft202012Validator:
    doc = json.loads((root / "schemas" / "trainprof-compare.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(doc)
    return jsonschema.Draft202012Validator(doc)


def valid(root, doc: dict) -> None:
    error = jsonschema.exceptions.best_match(schema(root).iter_errors(doc))
    assert error is None, f"{error.message[:400]} at {list(error.absolute_path)}"


class Page(HTMLParser):
    """What a person sees: sections, the step-time table's rows, the verdict rows."""

    def __init__(self, text: str):
        super().__init__()
        self.sections: list[str] = []
        self.rows: dict[str, list[str]] = {}
        self.changed: set[str] = set()
        self.tables: list[list[list[str]]] = []
        self.scripts = 0
        self.external: list[str] = []
        self.text = ""
        self._rule: str | None = None
        self._row: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.sections.append(a.get("id"))
        if tag == "script":
            self.scripts += 1
        for name in ("src", "href"):
            if name in a and not a[name].startswith("#"):
                self.external.append(a[name])
        if tag == "table":
            self.tables.append([])
        if tag == "tr":
            self._row = []
            self._rule = a.get("data-rule")
            if self._rule and "changed" in (a.get("class") or ""):
                self.changed.add(self._rule)
        if tag in ("td", "th") and self._row is not None:
            self._row.append("")

    def handle_endtag(self, tag):
        if tag == "tr" and self._row is not None:
            cells = [c.strip() for c in self._row]
            if self._rule:
                self.rows[self._rule] = cells
            elif self.tables:
                self.tables[-1].append(cells)
            self._row = self._rule = None

    def handle_data(self, data):
        self.text += data
        if self._row:
            self._row[-1] += data

    def table_with(self, header: str) -> list[list[str]]:
        return next(t for t in self.tables if t and t[0] and t[0][0] == header)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, promtool):
    """Two runs of a job: B's steps 30% slower, more of them in the dataloader, and its GPU
    idle enough for LowGPUUtilization (A's busy); compared, with the page and the JSON."""
    tmp = tmp_path_factory.mktemp("compare")
    phases_a = {"dataloader": 0.02, "forward": 0.03, "backward": 0.05}
    phases_b = {"dataloader": 0.05, "forward": 0.03, "backward": 0.05}
    write_run(tmp / "a.jsonl.gz", START, 14, 0.100, 0.92, job=HOSTILE, phases=phases_a)
    write_run(tmp / "b.jsonl.gz", START + 3600, 14, 0.130, 0.30, job=HOSTILE, phases=phases_b)
    (tmp / "rules.yaml").write_text(RULES)
    page = tmp / "compare.html"
    result = cli(
        "compare", str(tmp / "a.jsonl.gz"), str(tmp / "b.jsonl.gz"), "--rules",
        str(tmp / "rules.yaml"), "--labels", "before,after", "-o", str(page),
        "--json", str(tmp / "compare.json"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return tmp, page, json.loads((tmp / "compare.json").read_text()), result.stdout


def test_the_json_holds_the_runs_and_every_rule_per_run(runs, root):
    _, _, doc, _ = runs
    valid(root, doc)
    assert doc["version"] == 1 and doc["kind"] == "runs"
    assert [r["label"] for r in doc["runs"]] == ["before", "after"]
    assert all(r["training_job"] == HOSTILE for r in doc["runs"])
    for rule, by_run in doc["rules"].items():
        assert set(by_run) == {"before", "after"}, rule
    assert doc["rules"]["LowGPUUtilization"]["before"]["status"] == "quiet"
    assert doc["rules"]["LowGPUUtilization"]["after"]["status"] == "fired"
    assert {"rule": "LowGPUUtilization", "from": "quiet", "to": "fired"} in doc["verdict_changes"]


def test_step_time_changes_are_measured_and_judged(runs):
    _, _, doc, _ = runs
    st = doc["step_time"]
    # The means are exact (sum over count of the step histogram): 100 ms and 130 ms.
    assert st["runs"]["before"]["mean"] == pytest.approx(0.100, rel=1e-3)
    assert st["runs"]["after"]["mean"] == pytest.approx(0.130, rel=1e-3)
    assert st["change"]["mean"]["ratio"] == pytest.approx(0.30, rel=1e-2)
    # Steps of a fixed length do not move from window to window: any change is beyond.
    assert st["change"]["mean"]["beyond_noise"] is True
    # p50: 100 ms sits at a bucket bound (le 0.1), 130 ms in (0.1, 0.2]: resolved.
    assert st["change"]["p50"]["same_bucket"] is False
    assert st["runs"]["before"]["p50"] <= 0.1 < st["runs"]["after"]["p50"] <= 0.2
    shares = {d["le"]: d["share"] for d in st["runs"]["after"]["distribution"]}
    assert shares[0.2] == pytest.approx(1.0)


def test_the_time_moved_to_the_dataloader(runs):
    _, _, doc, _ = runs
    moved = doc["phases"]["moved"]
    assert moved[0]["phase"] == "dataloader"
    assert moved[0]["change_seconds_per_step"] == pytest.approx(0.03, rel=0.05)
    forward = doc["phases"]["phases"]["forward"]
    assert forward["change_seconds_per_step"] == pytest.approx(0.0, abs=1e-3)


def test_utilisation_is_compared_as_distributions(runs):
    _, _, doc, _ = runs
    gpu = doc["utilization"]["GPU utilization"]
    assert gpu["runs"]["before"]["p50"] == pytest.approx(0.92, abs=0.05)
    assert gpu["runs"]["after"]["p50"] == pytest.approx(0.30, abs=0.05)
    assert gpu["change"]["p50"] == pytest.approx(-0.62, abs=0.07)


def test_the_table_shows_the_changes(runs):
    _, _, _, table = runs
    lines = table.splitlines()
    mean = next(line for line in lines if "step time mean" in line)
    assert "100 ms" in mean and "130 ms" in mean and "+30.0%" in mean and "beyond noise" in mean
    low = next(line for line in lines if line.strip().startswith("LowGPUUtilization"))
    assert low.split()[1:3] == ["quiet", "fired"] and low.split()[-1] == "changed"
    assert re.fullmatch(r"x\d+", low.split()[3])  # times it fired


def test_the_page_shows_what_changed(runs, chromium):
    _, page, doc, _ = runs
    seen = Page(dump_dom(chromium, page))
    assert seen.sections == [
        "summary",
        "step-time",
        "phases",
        "utilization",
        "rules",
        "not-compared",
    ]
    steps = seen.table_with("Statistic")
    mean = next(r for r in steps if r[0] == "mean")
    assert mean[1:5] == ["100 ms", "130 ms", "+30 ms", "+30.0%"] and mean[-1] == "beyond noise"
    phases = seen.table_with("Phase")
    assert phases[1][0] == "dataloader"
    moved = re.fullmatch(r"\+([\d.]+) ms", phases[1][3])
    assert moved and float(moved.group(1)) == pytest.approx(30, rel=0.05)
    assert set(seen.rows) == set(doc["rules"])
    assert seen.changed == {c["rule"] for c in doc["verdict_changes"]}
    low = seen.rows["LowGPUUtilization"]
    assert low[1].startswith("quiet") and low[3].startswith("fired")
    # The measured value beside each verdict: the worst GPU's share of low samples.
    assert re.search(r"\d+%", low[4])


def test_the_page_is_self_contained_and_shows_markup_as_text(runs, chromium):
    _, page, _, _ = runs
    text = page.read_text()
    seen = Page(dump_dom(chromium, page))
    assert HOSTILE in seen.text
    assert seen.scripts == 0 and not seen.external
    assert "<script>" not in text
    assert "default-src 'none'" in text
    assert not re.search(r"url\(|@import|<link|<img|<iframe|<object", text)


def test_a_screenshot_renders_the_report(runs, chromium, tmp_path):
    _, page, _, _ = runs
    png = screenshot(chromium, page, tmp_path / "compare.png", 1200, 2400)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 50_000


def test_runs_of_different_sizes_say_what_was_not_compared(tmp_path, promtool, root):
    write_run(tmp_path / "a.jsonl.gz", START, 6, 0.1, 0.9, gpus=1)
    write_run(tmp_path / "b.jsonl.gz", START, 6, 0.1, 0.9, gpus=4)
    (tmp_path / "rules.yaml").write_text(RULES)
    result = cli(
        "compare", str(tmp_path / "a.jsonl.gz"), str(tmp_path / "b.jsonl.gz"),
        "--rules", str(tmp_path / "rules.yaml"), "--json", "-",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    valid(root, doc)
    assert [r["gpus"] for r in doc["runs"]] == [1, 4]
    sizes = [n for n in doc["not_comparable"] if n.startswith("sizes differ")]
    assert sizes and "1 GPU(s)" in sizes[0] and "4 GPU(s)" in sizes[0]
    # LoadBalancing needs two GPUs on a node: not applicable in A, a verdict in B.
    assert doc["rules"]["LoadBalancing"]["A"]["status"] == "not_applicable"
    assert doc["rules"]["LoadBalancing"]["A"]["reason"]


def test_a_run_without_steps_is_said_so(tmp_path, promtool, real_data):
    """Real SageMaker system metrics (no framework traces) against a recording with steps."""
    source = real_data / "real-sagemaker" / "trimcrae-8xtt-redock"
    write_run(tmp_path / "b.jsonl.gz", START, 6, 0.1, 0.9)
    result = cli("compare", str(source), str(tmp_path / "b.jsonl.gz"), "--json", "-")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["step_time"] is None and doc["phases"] is None
    assert any(
        n.startswith("step time: A recorded no training steps") for n in doc["not_comparable"]
    )
    assert doc["runs"][0]["gpus"] == 1 and doc["runs"][0]["steps"] == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["only-one"], "give two runs to compare, A and B (got 1)"),
        (["a", "b", "c"], "give two runs to compare, A and B (got 3)"),
        (["{tmp}/missing", "{tmp}/b.jsonl.gz"], "missing: no such file or folder"),
        (["{tmp}/t.pt.trace.json", "{tmp}/b.jsonl.gz"], "is a Kineto trace and B"),
        (["{tmp}/b.jsonl.gz", "{tmp}/b.jsonl.gz", "--labels", "x,x"], "must differ"),
        (["{tmp}/b.jsonl.gz", "{tmp}/b.jsonl.gz", "--labels", "a b,c"], "is not a label"),
        (["{tmp}/b.jsonl.gz", "--sagemaker", "{tmp}"], "--sagemaker JOB_DIR takes no A B"),
        (["--sagemaker", "{tmp}"], "no ProfilerReport verdicts here"),
        (["--sagemaker", "{tmp}/missing"], "not a folder"),
        (["{tmp}/t.pt.trace.json", "{tmp}/t.pt.trace.json"], "not valid JSON"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(tmp_path, args, message):
    (tmp_path / "b.jsonl.gz").write_bytes(b"")
    (tmp_path / "t.pt.trace.json").write_text("{not json")
    result = cli("compare", *[a.format(tmp=tmp_path) for a in args])
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_an_unwritable_report_fails_cleanly(runs, tmp_path):
    tmp, _, _, _ = runs
    result = cli(
        "compare", str(tmp / "a.jsonl.gz"), str(tmp / "b.jsonl.gz"), "--rules",
        str(tmp / "rules.yaml"), "-o", str(tmp_path / "missing" / "x.html"),
    )  # fmt: skip
    assert result.returncode == 1
    assert "cannot write" in result.stderr and "Traceback" not in result.stderr


def test_the_schema_refuses_a_document_without_rules(runs, root):
    _, _, doc, _ = runs
    broken = {k: v for k, v in doc.items() if k != "rules"}
    assert list(schema(root).iter_errors(broken))
    relabelled = json.loads(json.dumps(doc).replace('"after"', '"af ter"'))
    assert list(schema(root).iter_errors(relabelled))


def test_the_real_before_and_after_pair(real_data, root, promtool):
    """The real pair (tests/data/compare-pair): the fix took the per-image augmentation out
    of the data loading; compare says the steps got faster beyond both runs' noise, and that
    the time left the dataloader phase."""
    pair = real_data / "compare-pair"
    result = cli(
        "compare", str(pair / "before"), str(pair / "after"), "--labels", "before,after",
        "--json", "-",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    valid(root, doc)
    mean = doc["step_time"]["change"]["mean"]
    assert mean["ratio"] < -0.3 and mean["beyond_noise"] is True
    assert doc["phases"]["moved"][0]["phase"] == "dataloader"
    assert doc["phases"]["moved"][0]["change_seconds_per_step"] < -0.02
    augment = doc["phases"]["phases"]["augment"]["runs"]
    assert augment["before"]["seconds_per_step"] == 0 < augment["after"]["seconds_per_step"]
    # Both runs' host samples: a CPU utilisation distribution on each side.
    assert set(doc["utilization"]["CPU utilization"]["runs"]) == {"before", "after"}


def test_two_tensor_trials_compare_their_tensor_rules(tmp_path, root, promtool):
    """Two SageMaker Debugger trials (written with smdebug's own FileWriter) compare their
    tensor rules' verdicts; they hold no steps or system metrics, and the comparison says so."""
    import numpy as np

    from smdebug_writer import write_trial

    for name, falls in (("a", True), ("b", False)):
        losses = {i: {"CrossEntropyLoss_output_0": np.float32(1.0 - (i / 10 if falls else 0))}
                  for i in range(30)}  # fmt: skip
        write_trial(tmp_path / name / "debug-output", losses)
    result = cli("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json", "-")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    valid(root, doc)
    assert doc["step_time"] is None and doc["phases"] is None
    assert "LossNotDecreasing" in doc["rules"] and "CPUBottleneck" not in doc["rules"]
    statuses = {r: (v["A"]["status"], v["B"]["status"]) for r, v in doc["rules"].items()}
    assert statuses["LossNotDecreasing"] == ("quiet", "fired")
    assert {c["rule"] for c in doc["verdict_changes"]} == {
        r for r, (a, b) in statuses.items() if a != b
    }

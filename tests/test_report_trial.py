"""`trainprof report --replay DEBUG_OUTPUT_DIR`: the HTML report of a SageMaker Debugger tensor
trial shows each tensor rule's verdict (status, the training step it first fired at), the
same verdicts `trainprof replay DIR --json -` gives."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import numpy as np
import pytest

import warm_cli
from smdebug_writer import write_trial

RULES = "rules:\n  - rule: LossNotDecreasing\n  - rule: AllZero\n  - rule: UnchangedTensor\n"


def cli(*args) -> warm_cli.Run:
    """`python -m trainprof.cli ARGS` in a process of its own (forked with torch imported)."""
    return warm_cli.run(*args, timeout=300)


class Rows(HTMLParser):
    """The rules table: rule name -> its cells' text."""

    def __init__(self, text: str):
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self._row: str | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr":
            self._row = a.get("data-rule")
            if self._row:
                self.rows[self._row] = []
        if tag == "td" and self._row:
            self.rows[self._row].append("")

    def handle_data(self, data):
        if self._row and self.rows[self._row]:
            self.rows[self._row][-1] += data


@pytest.fixture
def trial(tmp_path):
    # SageMaker's deleted LossNotDecreasing test: first fires at step 12; weights that change
    # at every save (UnchangedTensor quiet) and are never all zero (AllZero quiet)
    losses = dict(zip((0, 4, 8, 12, 16), (0.30, 0.33, 0.31, 0.30, 0.28)))
    steps = {
        s: {
            "CrossEntropyLoss_output_0": np.float32(loss),
            "fc.weight": np.full(3, s + 1.0, np.float32),
        }
        for s, loss in losses.items()
    }
    return write_trial(tmp_path / "job-a" / "debug-output", steps)


def test_the_report_shows_each_tensor_rules_verdict_and_first_step(promtool, trial, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    out = tmp_path / "report.html"
    done = cli("report", "--replay", str(trial), "--rules", str(rules), "-o", str(out))
    assert done.returncode == 0, done.stderr
    rows = Rows(out.read_text()).rows
    assert set(rows) == {"LossNotDecreasing", "AllZero", "UnchangedTensor"}
    # cells: rule, description, recommendation, times triggered, first fired, status
    loss = rows["LossNotDecreasing"]
    assert loss[3].strip() == "1"
    assert loss[4].startswith("step 12 (")
    assert loss[5].strip().startswith("fired")
    for quiet in ("AllZero", "UnchangedTensor"):
        assert rows[quiet][3:5] == ["0", "-"]
        assert rows[quiet][5].strip().startswith("quiet")
    replayed = json.loads(cli("replay", str(trial), "--rules", str(rules), "--json", "-").stdout)
    for name, verdict in replayed["rules"].items():
        first = verdict["first_fired_step"]
        assert rows[name][4].startswith("-" if first is None else f"step {first} (")


def test_damaged_events_are_a_note_and_bad_rules_exit_2(promtool, trial, tmp_path):
    events = next((trial / "events").rglob("*.tfevents"))
    events.write_bytes(events.read_bytes()[:-7])  # truncated mid-record
    out = tmp_path / "report.html"
    done = cli("report", "--replay", str(trial), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "note: " in done.stderr and events.name in done.stderr
    assert "Traceback" not in done.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - rule: LossNotDecreasing\n    parameters: {num_steps: -1}\n")
    done = cli("report", "--replay", str(trial), "--rules", str(bad), "-o", str(out))
    assert done.returncode == 2
    assert "rules[0].parameters.num_steps" in done.stderr and "Traceback" not in done.stderr

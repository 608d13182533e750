"""A recording replayed keeps what the training loop said about itself: the job's name
(`start(training_job=...)`) and where each step's time went (`trainprof.phase()`), so a report
from a recording names the job and shows the phase shares the loop really had, and replay's
phase series are the ones the live training API served."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from html.parser import HTMLParser

import pytest

import trainprof
from trainprof.contract import recording
from trainprof.replay import Query, load_timeline, replay

# The loop measures its own phases with its own clock: the oracle the report is checked against.
TRAINER = textwrap.dedent(
    """
    import json, sys, time
    import trainprof

    path, steps = sys.argv[1], int(sys.argv[2])
    trainprof.start(serve=False, record=path, training_job="phase-job", node="n1", rank=0,
                    world_size=1)
    spent = {"dataloader": 0.0, "forward": 0.0, "backward": 0.0}
    sleeps = {"dataloader": 0.006, "forward": 0.002, "backward": 0.004}
    for _ in range(steps):
        with trainprof.step():
            for name, seconds in sleeps.items():
                with trainprof.phase(name):
                    began = time.perf_counter()
                    time.sleep(seconds)
                    spent[name] += time.perf_counter() - began
    print(json.dumps(spent))
    # no trainprof.stop(): the recording is closed at exit, as examples/pytorch_loop.py ends
    """
)
# Rules evaluated every second: promtool loads its input only up to the last rule evaluation
# at or before a query, so at SageMaker's one-minute scan a job of seconds would be cut short.
FAST_RULES = textwrap.dedent(
    """
    scrape_interval: 1s
    rules:
    - rule: ProfilerReport
      parameters: {scan_interval_us: 1000000}
    """
)


class _PhaseTable(HTMLParser):
    """The rows of the report's "Per-annotation durations" table: phase -> cells."""

    def __init__(self, text: str):
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self._in_table = self._in_caption = False
        self._caption = ""
        self._cells: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag == "caption":
            self._in_caption, self._caption = True, ""
        elif tag == "tr" and self._in_table:
            self._cells = []
        elif tag == "td" and self._cells is not None:
            self._cells.append("")

    def handle_endtag(self, tag):
        if tag == "caption":
            self._in_caption = False
            self._in_table = self._caption.strip() == "Per-annotation durations"
        elif tag == "table":
            self._in_table = False
        elif tag == "tr" and self._cells:
            self.rows[self._cells[0].strip()] = [c.strip() for c in self._cells[1:]]
            self._cells = None

    def handle_data(self, data):
        if self._in_caption:
            self._caption += data
        elif self._cells:
            self._cells[-1] += data


def _seconds(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+) ?(µs|ms|s|min)", text).groups()
    return float(number) * {"µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}[unit]


def _shown(text: str, seconds: float, rel: float) -> bool:
    """Whether `text` shows `seconds` within `rel`, or within the rounding of its last digit
    ("0.003 s" for 2.65 ms is as close as three decimals go)."""
    number = re.match(r"[\d.]+", text).group()
    digits = len(number.partition(".")[2])
    half_digit = 0.5 * 10**-digits * _seconds(text) / float(number) if float(number) else 0.0
    return abs(_seconds(text) - seconds) <= max(rel * seconds, half_digit)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real training loop that recorded itself, and what it measured of its phases."""
    folder = tmp_path_factory.mktemp("recorded") / "job"
    folder.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", TRAINER, str(folder / "rank0.jsonl.gz"), "400"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return folder, json.loads(done.stdout)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_replay_names_the_job_the_recording_names(trained, promtool):
    folder, _ = trained
    done = cli("replay", str(folder))
    assert done.returncode == 0, done.stderr
    assert f"Replayed {folder} (training_job phase-job)" in done.stdout
    named = cli("replay", str(folder), "--job", "renamed")
    assert "(training_job renamed)" in named.stdout  # --job still wins


def test_the_report_from_a_recording_shows_the_loops_phase_shares(trained, promtool, tmp_path):
    folder, spent = trained
    page, rules = tmp_path / "report.html", tmp_path / "rules.yaml"
    rules.write_text(FAST_RULES)
    done = cli(
        "report",
        "--replay",
        str(folder),
        "--rules",
        str(rules),
        "--scrape-interval",
        "1s",
        "-o",
        str(page),
    )
    assert done.returncode == 0, done.stderr
    assert ": phase-job, " in done.stderr
    html = page.read_text()
    assert "recorded-job" not in html and "phase-job" in html
    rows = _PhaseTable(html).rows
    total = sum(spent.values())
    for name, seconds in spent.items():
        share, in_range, per_step = rows[name]
        assert float(share.rstrip("%")) == pytest.approx(100 * seconds / total, abs=2.0), name
        assert _shown(in_range, seconds, rel=0.1), (name, in_range, seconds)
        assert _shown(per_step, seconds / 400, rel=0.1), (name, per_step, seconds / 400)
    # The step's time outside the three phases is "other": a sliver, never most of it.
    assert float(rows["other"][0].rstrip("%")) < 5


def test_replayed_phase_series_are_the_ones_the_live_api_served(tmp_path, promtool):
    trainprof.stop()
    session = trainprof.start(
        serve=False, record=str(tmp_path / "run.jsonl"), training_job="same", rank=0, node="n1"
    )
    try:
        for n in range(30):
            with trainprof.step():
                with trainprof.phase("forward"):
                    time.sleep(0.002)
                with trainprof.phase(f"custom-{n % 2}"):  # user annotations too
                    time.sleep(0.001)
            if n == 15:
                time.sleep(1.2)  # a phases record in the middle, one at the end
    finally:
        trainprof.stop()
    live = {
        phase: session.value("trainprof_training_phase_seconds_total", phase=phase)
        for phase in ("forward", "custom-0", "custom-1", "other", "dataloader")
    }
    assert live["forward"] > 0.05 and live["custom-1"] > 0.01

    def asked(compiled, job, seconds):
        return {"phases": Query(f'trainprof_training_phase_seconds_total{{training_job="{job}"}}')}

    (tmp_path / "rules.yaml").write_text(FAST_RULES)
    result = replay(str(tmp_path), str(tmp_path / "rules.yaml"), scrape_interval=1, queries=asked)
    assert result.training_job == "same"
    [(at, samples)] = [max(result.queries["phases"].items())]
    replayed = {labels["phase"]: value for labels, value in samples}
    assert replayed == pytest.approx(
        {**dict.fromkeys(replayed, 0.0), **live}, rel=1e-9, abs=1e-12
    ), at


def _write(path, records):
    with recording.open_recording(str(path), "w") as stream:
        for record in records:
            stream.write(json.dumps(record) + "\n")


def test_damaged_phase_records_are_skipped_with_their_line(tmp_path):
    t = 1_780_000_000.0
    _write(
        tmp_path / "rank.jsonl",
        [
            {"kind": "process", "node": "n", "rank": 0, "start": t, "training_job": "j"},
            {"kind": "step", "node": "n", "rank": 0, "mode": "train", "start": t, "end": t + 1},
            recording.phases_record("n", 0, t + 1, {"forward": 1.0}),
            {"kind": "phases", "node": "n", "rank": 0, "t": t + 2, "seconds": [1, 2]},
            {"kind": "phases", "node": "n", "rank": 0, "t": t + 3, "seconds": {"forward": -1}},
            {"kind": "phases", "node": "n", "rank": 0, "t": 5, "seconds": {"forward": 2.0}},
            recording.phases_record("n", 0, t + 4, {"forward": 3.0}),
        ],
    )
    timeline, notes = load_timeline(str(tmp_path), "auto", None)
    assert [dict(p.seconds)["forward"] for p in timeline.phases] == [1.0, 3.0]
    text = "\n".join(notes)
    assert "without node, rank, t or seconds" in text and "rank.jsonl:4" in text
    assert "negative, NaN or infinite seconds" in text and "rank.jsonl:5" in text
    assert "rank.jsonl:6" in text
    assert timeline.training_job == "j"


def test_two_job_names_are_said_and_the_first_is_used(tmp_path):
    t = 1_780_000_000.0
    for rank, job in ((0, "alpha"), (1, "beta")):
        _write(
            tmp_path / f"rank{rank}.jsonl",
            [
                {"kind": "process", "node": "n", "rank": rank, "start": t, "training_job": job},
                {
                    "kind": "step",
                    "node": "n",
                    "rank": rank,
                    "mode": "train",
                    "start": t,
                    "end": t + 1,
                },
            ],
        )
    timeline, notes = load_timeline(str(tmp_path), "auto", None)
    assert timeline.training_job == "alpha"
    assert any("name 2 training jobs" in n and "'beta' in rank1.jsonl" in n for n in notes)


KILLED = textwrap.dedent(
    """
    import os, signal, sys, time
    import trainprof

    trainprof.start(serve=False, record=sys.argv[1], training_job="killed-job")
    until = time.time() + 3.5
    while time.time() < until:
        with trainprof.step():
            with trainprof.phase("forward"):
                time.sleep(0.003)
    print(time.time(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl"])
def test_a_trainer_killed_mid_loop_loses_at_most_the_last_flush(tmp_path, suffix):
    """docs/replay.md: `kill -9` loses at most the last second of a rank's recording."""
    path = tmp_path / f"rank{suffix}"
    done = subprocess.run(
        [sys.executable, "-c", KILLED, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -9, done.stderr
    killed_at = float(done.stdout)
    timeline, notes = load_timeline(str(tmp_path), "auto", None)
    assert timeline.training_job == "killed-job"
    # One flush interval (1 s), and some slack for a loaded machine.
    assert killed_at - timeline.steps[-1].end < 1.5, notes
    assert killed_at - timeline.phases[-1].t < 1.5
    assert dict(timeline.phases[-1].seconds)["forward"] > 0.5

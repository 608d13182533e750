"""The window a trace summary covers (HTA's: the last profiler step left out unless
`--include-last-step`), on hand-made traces where every figure is worked out in the comment,
and on traces torch.profiler wrote here (tests/data/torch-profiler-traces, CPU only: the
reader's edge cases: a step cut short, one step, no steps, two ranks, plain JSON, stacks and
memory events)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_trace import kernel, launch, write
from trainprof.trace import read_trace, summarize
from trainprof.trace import window as window_module

from real_traces import TORCH_TRACES


def step(n, ts, dur, cat="user_annotation"):
    return {"ph": "X", "cat": cat, "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur}


# Three steps on the host, [0,100), [100,200), [200,250); the last is cut short.
# Launches at 10 (step 1), 150 (step 2), 200 (exactly when step 3 begins), 260 (after the
# last step ended); one kernel has no launch in the trace (launched before it began).
# Kernels: [20,30) #1, [160,180) #2, [210,230) #3, [270,280) #4, [5,8) no launch.
STEPPED = [
    step(1, 0, 100),
    step(2, 100, 100),
    step(3, 200, 50),
    launch(10, 1),
    launch(150, 2),
    launch(200, 3),
    launch(260, 4),
    kernel("a", 20, 10, correlation=1),
    kernel("b", 160, 20, correlation=2),
    kernel("c", 210, 20, correlation=3),
    kernel("d", 270, 10, correlation=4),
    kernel("early", 5, 3, correlation=99),
]


def test_by_default_the_last_step_s_work_is_left_out(tmp_path):
    s = summarize(read_trace(write(tmp_path, STEPPED)))
    # launched before 200: a [20,30) and b [160,180): span 160 us, busy 30 us
    assert s["span_seconds"] == pytest.approx(160e-6)
    assert s["idle_seconds"] == pytest.approx(130e-6)
    assert [k["name"] for k in s["top_kernels"]] == ["b", "a"]
    w = s["window"]
    assert w["steps"] == ["ProfilerStep#1", "ProfilerStep#2"]
    assert w["left_out_step"] == "ProfilerStep#3" and w["profiler_steps"] == 3
    assert (w["device_events"], w["device_events_left_out"]) == (2, 3)
    assert w["device_events_without_launch"] == 1
    assert s["steps"]["count"] == 2


def test_include_last_step_keeps_what_was_launched_until_it_ended(tmp_path):
    s = summarize(read_trace(write(tmp_path, STEPPED)), include_last_step=True)
    # launched up to 250: a, b, c [210,230): span [20,230) = 210 us, busy 50 us; d launched
    # at 260 after the last step and the unlaunched kernel stay out, as in HTA.
    assert s["span_seconds"] == pytest.approx(210e-6)
    assert s["idle_seconds"] == pytest.approx(160e-6)
    assert {k["name"] for k in s["top_kernels"]} == {"a", "b", "c"}
    assert s["window"]["left_out_step"] is None and s["window"]["device_events_left_out"] == 2
    assert s["steps"]["count"] == 3


@pytest.mark.parametrize(
    "events, expected",
    [
        (STEPPED[3:], "the whole trace"),  # no steps: every GPU event, launched or not
        ([step(1, 0, 300), *STEPPED[3:]], "the whole trace (one profiler step: nothing to"),
        # Two annotations of one step are one step: nothing to window by, as in HTA
        ([step(1, 0, 100), step(1, 100, 100), *STEPPED[3:]], "the whole trace (one"),
    ],
)
def test_fewer_than_two_steps_summarize_the_whole_trace(tmp_path, events, expected):
    s = summarize(read_trace(write(tmp_path, events)))
    assert s["span_seconds"] == pytest.approx(275e-6)  # [5,280)
    assert s["window"]["device_events_left_out"] == 0
    assert window_module.describe(s["window"]).startswith(expected)


def test_old_traces_with_steps_as_cpu_ops_are_windowed_too(tmp_path):
    events = [step(1, 0, 100, "cpu_op"), step(2, 100, 100, "cpu_op"), *STEPPED[3:]]
    s = summarize(read_trace(write(tmp_path, events)))
    assert s["window"]["left_out_step"] == "ProfilerStep#2"
    assert s["span_seconds"] == pytest.approx(10e-6)  # only a, launched at 10 < 100


def test_the_command_line_says_which_window(tmp_path):
    path = write(tmp_path, STEPPED)
    text = _cli(path)
    assert text.returncode == 0, text.stderr
    assert "window: ProfilerStep#1..#2: 2 of 3 profiler steps, the last (ProfilerStep#3)" in (
        text.stdout
    )
    assert "3 GPU events left out (1 launched before the trace began" in text.stdout
    kept = _cli(path, "--include-last-step", "--json", "-")
    window = json.loads(kept.stdout)["ranks"]["0"]["window"]
    assert window["include_last_step"] is True and window["left_out_step"] is None


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "trace", "summarize", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


# --- traces torch.profiler wrote ---------------------------------------------------------


def torch_trace(name: str) -> Path:
    path = TORCH_TRACES / name
    assert path.is_file(), f"missing test data {path} (make_traces.py writes it)"
    return path


def test_a_step_cut_short_by_the_profiler_is_left_out():
    path = torch_trace("cpu-steps-cut-short.pt.trace.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    steps = sorted(
        (e["ts"], e["name"]) for e in doc["traceEvents"] if e["name"].startswith("ProfilerStep#")
    )
    trace = read_trace(path)
    assert trace.skipped == 0  # memory instant events, flows, metadata: not malformed
    default, whole = summarize(trace), summarize(trace, include_last_step=True)
    assert default["window"]["left_out_step"] == steps[-1][1] == "ProfilerStep#6"
    assert default["steps"]["count"] == len(steps) - 1 and whole["steps"]["count"] == len(steps)
    # the annotations of the half step recorded after the last p.step() are left out too
    assert default["annotations"]["forward"]["count"] == len(steps) - 1
    assert whole["annotations"]["forward"]["count"] == len(steps)
    cpu = default["cpu_gpu_overlap"]["cpu_busy_seconds"]
    assert 0 < cpu < whole["cpu_gpu_overlap"]["cpu_busy_seconds"]
    assert default["span_seconds"] == 0 and default["top_kernels"] == []


def test_one_step_in_plain_json_and_no_steps_are_the_whole_trace():
    one = summarize(read_trace(torch_trace("cpu-one-step.pt.trace.json")))
    assert one["window"]["profiler_steps"] == 1 and one["steps"]["count"] == 1
    assert "one profiler step" in window_module.describe(one["window"])
    none = summarize(read_trace(torch_trace("cpu-no-steps.pt.trace.json.gz")))
    assert none["window"]["profiler_steps"] == 0 and none["steps"] == {"count": 0}
    assert none["cpu_gpu_overlap"]["cpu_busy_seconds"] > 0


def test_two_ranks_of_a_gloo_job():
    paths = [torch_trace(f"cpu-gloo-rank{r}.pt.trace.json.gz") for r in (1, 0)]
    result = _cli(*paths, "--json", "-")
    assert result.returncode == 0, result.stderr
    ranks = json.loads(result.stdout)["ranks"]
    assert sorted(ranks) == ["0", "1"]
    for s in ranks.values():
        assert s["window"]["left_out_step"] == "ProfilerStep#3"
        assert s["steps"]["count"] == 2 and s["skipped_events"] == 0
    text = _cli(*paths)
    assert "no GPU activity in this window" in text.stdout
    same_rank = _cli(paths[1], torch_trace("cpu-no-steps.pt.trace.json.gz"))
    assert same_rank.returncode == 2 and "rank 0 again" in same_rank.stderr

"""`trainprof compare` of two Kineto traces against Holistic Trace Analysis' own trace diff
(`hta.trace_diff.TraceDiff`) on the same pairs of real traces.

HTA runs in its own process (tests/hta_diff_peer.py imports nothing from trainprof) over the
window it leaves by default (the last profiler step out); trainprof runs through its command
line. Every kernel (GPU) and operator (CPU, `cpu_op`) HTA's diff names must have trainprof's
count and total time to the nanosecond, and the same change category (HTA's "deleted" is
trainprof's "removed") where both windows hold as many steps.

Where they differ, the reason is shown by removing it: HTA gives a GPU event an iteration
only on a stream numbered above 0 (`hta.common.trace.add_iteration`), so on the MI250 trace,
whose kernels all run on stream 0, its diff sees no kernel at all; moved to stream 1 (a copy
of the trace), HTA finds exactly trainprof's kernels.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "tests" / "data" / "real-gpu-traces"
PAIR = ROOT / "tests" / "data" / "compare-pair"
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
HTA_CHANGE = {"deleted": "removed"}


def hta(peer: list[str], a: Path, b: Path, *flags: str) -> dict:
    result = subprocess.run(
        [*peer, str(a), str(b), *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def trainprof(a: Path, b: Path, *flags: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "compare", str(a), str(b), "--json", "-", *flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def agree(peer: dict, mine: dict, device: str, key: str, categories: set[str], sides=(0, 1)):
    """Every name HTA's diff counts (of `categories`) with trainprof's counts and times;
    returns HTA's rows and trainprof's entries by name."""
    theirs = {n: v for n, v in peer[device].items() if v["cat"] in categories}
    entries = {e["name"]: e for e in mine[key]["entries"]}
    labels = [r["label"] for r in mine["runs"]]
    for name, row in theirs.items():
        assert name in entries, f"HTA counts {name[:80]}, trainprof does not"
        for side, prefix in ((0, "control"), (1, "test")):
            if side not in sides:
                continue
            got = entries[name]["runs"][labels[side]]
            assert got["total"] == row[f"{prefix}_count"], (name[:80], prefix)
            assert got["total_seconds"] * 1e6 == pytest.approx(row[f"{prefix}_us"], abs=0.01)
    return theirs, entries


def same_categories(theirs: dict, entries: dict) -> None:
    for name, row in theirs.items():
        assert entries[name]["change"] == HTA_CHANGE.get(row["change"], row["change"]), name


def test_a_trace_against_itself_changes_nothing(hta_diff_peer, real_data):
    trace = TRACES / "a100-nccl-training.pt.trace.json.gz"
    peer, mine = hta(hta_diff_peer, trace, trace), trainprof(trace, trace)
    assert peer["iterations"] == [[4, 5], [4, 5]]
    assert [r["steps"] for r in mine["runs"]] == [2, 2]
    for device, key, cats in (("gpu", "kernels", GPU_CATEGORIES), ("cpu", "operators", {"cpu_op"})):
        theirs, entries = agree(peer, mine, device, key, cats)
        assert len(theirs) == len(entries) > 50
        same_categories(theirs, entries)
        assert mine[key]["summary"]["unchanged"] == len(entries)
    assert all(row["change"] == 0 for row in mine["time_classes"]["classes"].values())


def test_the_last_step_kept_as_hta_keeps_it(hta_diff_peer, real_data):
    trace = TRACES / "a100-nccl-training.pt.trace.json.gz"
    peer = hta(hta_diff_peer, trace, trace, "--include-last-step")
    mine = trainprof(trace, trace, "--include-last-step")
    assert peer["iterations"] == [[4, 5, 6], [4, 5, 6]]
    assert [r["steps"] for r in mine["runs"]] == [3, 3]
    for device, key, cats in (("gpu", "kernels", GPU_CATEGORIES), ("cpu", "operators", {"cpu_op"})):
        theirs, entries = agree(peer, mine, device, key, cats)
        assert len(theirs) == len(entries)


def test_two_gpus_two_models(hta_diff_peer, real_data):
    """The A100 NCCL training trace against the MI250 one: every operator agrees; every A100
    kernel agrees, and HTA's diff sees none of the MI250's (stream 0: see the next test)."""
    a = TRACES / "a100-nccl-training.pt.trace.json.gz"
    b = TRACES / "mi250-toy-train.pt.trace.json.gz"
    peer, mine = hta(hta_diff_peer, a, b), trainprof(a, b)
    assert peer["iterations"] == [[4, 5], [1]]
    theirs, entries = agree(peer, mine, "cpu", "operators", {"cpu_op"})
    assert len(theirs) == len(entries)
    agree(peer, mine, "gpu", "kernels", GPU_CATEGORIES, sides=(0,))
    assert all(row["test_count"] == 0 for row in peer["gpu"].values())
    mi250 = [e for e in mine["kernels"]["entries"] if e["runs"]["B"]["total"]]
    assert len(mi250) >= 5
    # Two steps against one: trainprof counts per step, and says so.
    assert mine["kernels"]["per"] == "per profiler step"
    assert any("step counts differ" in n for n in mine["not_comparable"])


def test_hta_sees_the_mi250_kernels_once_off_stream_0(hta_diff_peer, real_data, tmp_path):
    source = TRACES / "mi250-toy-train.pt.trace.json.gz"
    doc = json.loads(gzip.decompress(source.read_bytes()))
    moved = 0
    for event in doc["traceEvents"]:
        args = event.get("args") or {}
        if event.get("cat") in GPU_CATEGORIES and args.get("stream") == 0:
            args["stream"] = 1
            moved += 1
    assert moved >= 10
    copy = tmp_path / "mi250-stream1.pt.trace.json.gz"
    copy.write_bytes(gzip.compress(json.dumps(doc).encode()))
    a = TRACES / "a100-nccl-training.pt.trace.json.gz"
    peer, mine = hta(hta_diff_peer, a, copy), trainprof(a, copy)
    theirs, entries = agree(peer, mine, "gpu", "kernels", GPU_CATEGORIES)
    assert {n for n, e in entries.items() if e["runs"]["B"]["total"]} == {
        n for n, v in theirs.items() if v["test_count"]
    }
    # The stream number is no part of trainprof's diff: the same figures either way.
    original = trainprof(a, source)
    assert original["kernels"] == mine["kernels"]


def test_the_real_pair_before_and_after(hta_diff_peer, real_data):
    """The CPU traces of the real before/after pair (tests/data/compare-pair): operators
    only, every one as HTA's diff counts it, with its categories (both windows: 2 steps)."""
    before = PAIR / "before" / "trace.pt.trace.json.gz"
    after = PAIR / "after" / "trace.pt.trace.json.gz"
    peer, mine = hta(hta_diff_peer, before, after), trainprof(before, after)
    assert [r["steps"] for r in mine["runs"]] == [2, 2]
    theirs, entries = agree(peer, mine, "cpu", "operators", {"cpu_op"})
    assert len(theirs) == len(entries) > 10
    same_categories(theirs, entries)
    assert not mine["kernels"]["entries"]  # a CPU run: no GPU work
    # The fix took the per-image convolutions out of the loop: fewer of them per step.
    conv = entries["aten::conv2d"]
    assert conv["change"] == "decreased"
    assert conv["runs"]["B"]["count"] < conv["runs"]["A"]["count"]


def test_the_trace_page_shows_the_classes_and_the_names_that_changed(tmp_path, chromium, real_data):
    from browser import dump_dom

    a = TRACES / "a100-nccl-training.pt.trace.json.gz"
    b = TRACES / "mi250-toy-train.pt.trace.json.gz"
    page = tmp_path / "traces.html"
    result = subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "compare", str(a), str(b), "-o", str(page)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    dom = dump_dom(chromium, page)
    for section in ("summary", "time-classes", "kernels", "operators", "not-compared"):
        assert f'id="{section}"' in dom, section
    # The biggest mover: the A100 run's NCCL all-reduce, removed.
    assert "ncclKernel_AllReduce_RING_LL_Sum_float" in dom
    assert "removed (65" in dom and "<script" not in page.read_text()

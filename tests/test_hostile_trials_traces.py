"""Hostile tensor trials, profiler output, recordings and Kineto traces, each fed to the
command line in its own process (tests/warm_cli.py: a fork of a Python with torch imported)
under a memory limit and a timeout: a clear one-line error
(exit 2) or a skipped-and-reported part with the rest still read, never a traceback, a hang
or memory unbounded by the input.

Each case is built in the test's temporary directory; the large ones are sparse files or
gzip members repeated, so they cost the disk nothing. Run as a script, this file measures
every case (seconds, peak RSS, exit code):

    python tests/test_hostile_trials_traces.py [--timeout SECONDS] [CASE...]
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import struct
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from trainprof.contract import recording
from trainprof.contract.sampling import GpuSample, HostSample
from trainprof.replay.synthetic import write_system

sys.path.insert(0, str(Path(__file__).resolve().parent))
import warm_cli  # noqa: E402
from smdebug_writer import _bytes, _int, _key, event, masked, record, write_trial  # noqa: E402

GIB = 1 << 30
MEMORY_LIMIT = 2 * GIB  # address space: Python, torch and promtool fit in it with room
TIMEOUT = 240
START = 1_700_000_000


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[Path], list[str]]  # the command's arguments after `trainprof`
    exit_code: int
    says: str  # in the one line that reports it
    still_read: str = ""  # on stdout: the rest of the input was read
    slow: str = ""  # why the case is in the slow tier (make test runs it, test-fast not)


# --- tensor trials ---------------------------------------------------------------------------


def _trial(root: Path, **kwargs) -> Path:
    """Five saved steps of a loss and a gradient, written as smdebug's FileWriter does."""
    rng = np.random.default_rng(0)
    steps = {
        s: {"loss": np.float32(1.0 / (s + 1)), "gradients/fc.weight": rng.random(4, np.float32)}
        for s in range(5)
    }
    return write_trial(root, steps, **kwargs)


def _append(root: Path, step: int, data: bytes) -> list[str]:
    path = root / "events" / f"{step:012d}" / f"{step:012d}_worker_0.tfevents"
    with path.open("ab") as f:
        f.write(data)
    return ["replay", str(root)]


def _collections(root: Path, text: str) -> list[str]:
    (root / "collections" / "000000000" / "worker_0_collections.json").write_text(text)
    return ["replay", str(root)]


def redos(tmp: Path) -> list[str]:
    # RE2 runs the first in linear time; it refuses the second (a lookahead), which Python's re
    # then matches within a budget of time
    regexes = {"weights": ["^(a+)+$"], "biases": ["^(?!b)(a+)+$"]}
    root = _trial(tmp / "trial", regexes=regexes)
    return _append(root, 3, record(event("a" * 40 + "b", np.ones(3, np.float32), 3)))


def shape_bomb(tmp: Path) -> list[str]:
    dims = b"".join(_bytes(2, _int(1, 100_000)) for _ in range(2))
    tensor = _int(1, 1) + _bytes(2, dims) + _key(5, 5) + struct.pack("<f", 1.0)
    value = _bytes(1, b"gradients/bomb") + _bytes(8, tensor)
    bomb = _key(1, 1) + struct.pack("<d", 1.7e9) + _int(2, 2) + _bytes(5, _bytes(1, value))
    return _append(_trial(tmp / "trial"), 2, record(bomb))


def wrong_wire_type(tmp: Path) -> list[str]:
    # an Event whose summary (a message) is a varint, under a valid CRC
    damaged = _key(1, 1) + struct.pack("<d", 1.7e9) + _int(2, 2) + _int(5, 7)
    return _append(_trial(tmp / "trial"), 2, record(damaged))


def tensor_names_5(tmp: Path) -> list[str]:
    root = _trial(tmp / "trial", collections={"losses": ["loss"]})
    body = {"collections": {"losses": {"tensor_names": 5, "include_regex": []}}}
    return _collections(root, json.dumps(body))


def deep_collections(tmp: Path) -> list[str]:
    root = _trial(tmp / "trial", collections={"losses": ["loss"]})
    return _collections(root, '{"collections": ' + "[" * 200_000 + "]" * 200_000 + "}")


def empty_predictions(tmp: Path) -> list[str]:
    steps = {
        s: {
            "loss": np.float32(1.0),
            "labels": np.array([1, 0], np.int64),
            "predictions": np.zeros(0, np.int64),
        }
        for s in range(5)
    }
    return ["replay", str(write_trial(tmp / "trial", steps))]


def _sparse(path: Path, size: int = GIB) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.truncate(size)


def stray_tfevents(tmp: Path) -> list[str]:
    root = _trial(tmp / "trial")
    _sparse(root / "events" / "000000000005" / "000000000005_worker_0.tfevents")
    _sparse(root / "events" / "000000000002" / "stray.bin")
    return ["replay", str(root)]


def forged_record_length(tmp: Path) -> list[str]:
    length = struct.pack("<Q", 1 << 40)  # under its own valid checksum
    return _append(_trial(tmp / "trial"), 2, length + struct.pack("<I", masked(length)) + b"x")


def stray_collections_and_marker(tmp: Path) -> list[str]:
    root = _trial(tmp / "trial", collections={"losses": ["loss"]})
    _sparse(root / "collections" / "000000000" / "huge_collections.json")
    _sparse(root / "training_job_end.ts")
    return ["replay", str(root)]


# --- profiler output and recordings ----------------------------------------------------------


def _sagemaker(tmp: Path) -> Path:
    hosts = {"algo-1": {"cores": 2, "gpus": 1, "timeline": [{"gpu_util": 0.03, "cpu": 0.97}]}}
    write_system(str(tmp / "job" / "profiler-output"), START, 12 * 60, 0.5, hosts)
    return tmp / "job"


def stray_system_file(tmp: Path) -> list[str]:
    job = _sagemaker(tmp)
    folder = next((job / "profiler-output" / "system" / "incremental").rglob("*.json")).parent
    _sparse(folder / "1700009999.algo-1.json")
    return ["replay", str(job)]


def stray_trace_file(tmp: Path) -> list[str]:
    job = _sagemaker(tmp)
    pevents = job / "profiler-output" / "framework" / "pevents" / "2023111422"
    _sparse(pevents / "1700000100000000_0-algo-1_pythontimeline.json")
    return ["replay", str(job)]


def one_line_recording(tmp: Path) -> list[str]:
    folder = tmp / "rec"
    folder.mkdir()
    with recording.open_recording(str(folder / "host.jsonl"), "w") as stream:
        writer = recording.Writer(stream)
        writer.write(recording.meta(0.5, "test"))
        for k in range(12 * 120):
            gpu = GpuSample(0, "gpu0", utilization=0.03, memory_used_ratio=0.5)
            sample = HostSample(
                START + k * 0.5,
                cpu_utilization=[0.97, 0.97],
                cpu_iowait=[0.0, 0.0],
                memory_used_ratio=0.3,
                gpus=[gpu],
            )
            writer.write(recording.host_record("algo-1", sample))
    _sparse(folder / "stray.jsonl")  # one line of a billion NUL characters
    return ["replay", str(folder)]


# --- Kineto traces ---------------------------------------------------------------------------


def _good_trace(tmp: Path) -> Path:
    path = tmp / "good.pt.trace.json"
    events = [
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 10.0, "dur": 5.0, "args": {}},
        {"ph": "X", "cat": "kernel", "name": "relu", "ts": 20.0, "dur": 2.0, "args": {}},
    ]
    path.write_text(json.dumps({"distributedInfo": {"rank": 0}, "traceEvents": events}))
    return path


def trace_gzip_bomb(tmp: Path) -> list[str]:
    spaces = gzip.compress(b" " * (64 << 20), compresslevel=9)
    bomb = tmp / "bomb.pt.trace.json.gz"
    with bomb.open("wb") as f:
        f.write(gzip.compress(b'{"distributedInfo": {"rank": 1}, "traceEvents": ['))
        for _ in range(2 * GIB // (64 << 20) + 1):  # gzip members, one after another
            f.write(spaces)
    return ["trace", "summarize", str(_good_trace(tmp)), str(bomb)]


def trace_deep(tmp: Path) -> list[str]:
    deep = tmp / "deep.pt.trace.json"
    deep.write_text('{"traceEvents": [' + "[" * 200_000 + "]" * 200_000 + "]}")
    return ["trace", "summarize", str(_good_trace(tmp)), str(deep)]


def trace_huge_event(tmp: Path) -> list[str]:
    huge = tmp / "huge.pt.trace.json"
    huge.write_text('{"traceEvents": [{"name": "' + "x" * (40 << 20) + '"}]}')
    return ["trace", "summarize", str(_good_trace(tmp)), str(huge)]


def trace_stray_file(tmp: Path) -> list[str]:
    stray = tmp / "stray.pt.trace.json"
    _sparse(stray)
    return ["trace", "summarize", str(_good_trace(tmp)), str(stray)]


TRIAL_READ = "5 saved steps (0 to 4)"
CASES = [
    Case(
        "include_regex ^(a+)+$",
        redos,
        0,
        "matching took over 2 s",
        TRIAL_READ,
        slow="waits out the 2 s matching budget",
    ),
    Case("shape [100000, 100000]", shape_bomb, 0, "shape [100000, 100000]", TRIAL_READ),
    Case("wrong wire type", wrong_wire_type, 0, "summary (field 5) is a varint", TRIAL_READ),
    Case("tensor_names: 5", tensor_names_5, 0, "tensor_names is not a list", TRIAL_READ),
    Case("200,000-deep collections", deep_collections, 0, "nested too deeply", TRIAL_READ),
    Case("empty predictions", empty_predictions, 0, "predictions at step 0", TRIAL_READ),
    Case("1 GiB .tfevents", stray_tfevents, 0, "length checksum mismatch", TRIAL_READ),
    Case("1 GiB stray file", stray_tfevents, 0, "not named *.tfevents: 000000000002", TRIAL_READ),
    Case("forged 1 TiB record", forged_record_length, 0, "truncated data", TRIAL_READ),
    Case("1 GiB collections", stray_collections_and_marker, 0, "skipped unread", TRIAL_READ),
    Case("1 GiB system file", stray_system_file, 0, "larger than a minute", "LowGPUUtilization"),
    Case("1 GiB framework trace", stray_trace_file, 0, "larger than smdebug", "LowGPUUtilization"),
    Case(
        "1 GiB one-line recording",
        one_line_recording,
        0,
        "longer than 1 MiB",
        "1440 samples",
        slow="reads through the 1 GiB line",
    ),
    Case(
        "trace: 2 GiB gzip bomb",
        trace_gzip_bomb,
        2,
        "more than 2 GiB",
        "rank 0",
        slow="decompresses 2 GiB",
    ),
    Case("trace: 200,000-deep", trace_deep, 2, "nested too deeply", "rank 0"),
    Case("trace: 40 MiB event", trace_huge_event, 2, "runs past 16 MiB", "rank 0"),
    Case("trace: 1 GiB of NUL", trace_stray_file, 2, "not valid JSON", "rank 0"),
]


def run_case(
    args: list[str], timeout: float = TIMEOUT, fresh: bool = False
) -> tuple[int, str, str, float, float]:
    """(exit code, stdout, stderr, seconds, peak RSS in MB) of `trainprof ARGS` run in its own
    process under MEMORY_LIMIT (a fork of tests/warm_cli.py's server, torch already imported;
    `fresh`: a new interpreter); exit code -9 when killed at the timeout."""
    run = warm_cli.run(*args, timeout=timeout, memory=MEMORY_LIMIT, fresh=fresh)
    return run.returncode, run.stdout, run.stderr, run.seconds, run.maxrss_kb / 1024


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, id=c.name, marks=[pytest.mark.slow(reason=c.slow)] if c.slow else [])
        for c in CASES
    ],
)
def test_hostile_input_is_one_line_and_the_rest_is_read(case, tmp_path, promtool):
    code, stdout, stderr, _, _ = run_case(case.build(tmp_path))
    assert "Traceback" not in stderr, stderr[-3000:]
    assert code == case.exit_code, stderr[-3000:]
    said = [line for line in stderr.splitlines() if case.says in line]
    assert said, stderr[-3000:]
    # each report is one line of its own: no continuation, no absl or numpy chatter
    assert all(line.startswith(("note: ", "error: ", "warning: ")) for line in stderr.splitlines())
    assert case.still_read in stdout, stdout[-2000:]


def main(names: list[str]) -> None:
    timeout = TIMEOUT
    if names[:1] == ["--timeout"]:
        timeout, names = float(names[1]), names[2:]
    print(f"{'case':<28} {'exit':>4} {'seconds':>8} {'peak MB':>8}  reported")
    for case in CASES:
        if names and case.name not in names:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            code, _, stderr, seconds, peak = run_case(case.build(Path(tmp)), timeout, fresh=True)
        lines = [line for line in stderr.splitlines() if line.strip()]
        tail = "Traceback: " + lines[-1] if "Traceback" in stderr else (lines or ["-"])[-1]
        tail = "killed at the timeout" if code == -9 else tail
        said = next((line for line in lines if case.says in line), tail)
        print(f"{case.name:<28} {code:>4} {seconds:>8.1f} {peak:>8.0f}  {said[:110]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Seconds and peak memory of `trainprof replay` on a tensor trial of N saved steps, and of
`trainprof trace summarize` on a Kineto trace of N events.

    python benchmarks/trial_trace_scale.py [--steps 10000 100000] [--events 1000000]
        [--rounds 3] [--before SRC] [--keep DIR]

The trial: every step saves a loss, a gradient, a weight and a ReLU output of 64 float32
values each, one smdebug event file per step (events/<step>/<step>_worker_0.tfevents, the
framing and protobuf written here from the TFRecord and Event descriptions); the default
tensor rules are replayed over it. The trace: a third each of cpu_op, cudaLaunchKernel and
kernel events over 50 kernel names, gzip-compressed as torch.profiler writes it.

Each command runs in its own process: wall and CPU seconds (its own and promtool's), peak RSS
of the command and of its largest promtool run. `--before SRC` runs the same inputs with
another tree's `src` on PYTHONPATH (e.g. `git archive main src | tar -x -C /tmp/before`),
interleaved with this tree round by round: medians with [min, max] over `--rounds`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

try:
    from google_crc32c import value as crc32c
except ImportError:  # pragma: no cover - the tools extra installs it
    sys.exit("benchmarks/trial_trace_scale.py needs google-crc32c (pip install google-crc32c)")

CHILD = r"""
import json, resource, sys, time
from trainprof.cli import main
t = time.perf_counter()
code = main(sys.argv[1:])
wall = time.perf_counter() - t
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"code": code, "wall": wall, "cpu": me.ru_utime + me.ru_stime,
    "promtool_cpu": kids.ru_utime + kids.ru_stime, "rss_mb": me.ru_maxrss / 1024,
    "promtool_rss_mb": kids.ru_maxrss / 1024}), file=sys.stderr)
"""


def _masked(data: bytes) -> bytes:
    crc = crc32c(data)
    return struct.pack("<I", ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF)


def _record(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + _masked(length) + data + _masked(data)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(tag: str, value: np.ndarray, step: int) -> bytes:
    """Event{wall_time, step, summary{value{tag, metadata{mode, mode_step}, tensor}}}."""
    dims = b"".join(_field(2, _varint(1 << 3) + _varint(d)) for d in value.shape)
    tensor = _varint(1 << 3) + _varint(1) + _field(2, dims) + _field(4, value.tobytes())
    plugins = _field(1, _field(1, b"mode") + _field(2, b"1")) + _field(
        1, _field(1, b"mode_step") + _field(2, str(step).encode())
    )
    summary_value = _field(1, tag.encode()) + _field(9, plugins) + _field(8, tensor)
    head = _varint(1 << 3 | 1) + struct.pack("<d", 1.7e9 + step) + _varint(2 << 3) + _varint(step)
    return head + _field(5, _field(1, summary_value))


def write_trial(root: Path, steps: int) -> None:
    rng = np.random.default_rng(0)
    weight = rng.normal(size=64).astype(np.float32)
    for step in range(steps):
        folder = root / "events" / f"{step:012d}"
        folder.mkdir(parents=True)
        weight -= 1e-3 * rng.normal(size=64).astype(np.float32)
        tensors = {
            "loss": np.array([1.0 / (1 + step)], np.float32),
            "gradients/fc.weight": rng.normal(size=64).astype(np.float32),
            "fc.weight": weight,
            "relu0_output_0": np.maximum(rng.normal(size=64), 0).astype(np.float32),
        }
        data = b"".join(_record(_event(name, v, step)) for name, v in tensors.items())
        (folder / f"{step:012d}_worker_0.tfevents").write_bytes(data)
    (root / "training_job_end.ts").write_text("")


def write_trace(path: Path, events: int) -> None:
    names = [f"void gemm_kernel_{i}<float, 128>(float*, float const*, int)" for i in range(50)]
    with gzip.open(path, "wt", compresslevel=1) as f:
        f.write('{"schemaVersion": 1, "distributedInfo": {"rank": 0},\n')
        f.write('"deviceProperties": [{"id": 0, "name": "NVIDIA H100"}],\n"traceEvents": [\n')
        t = 1_000_000.0
        rows = []
        for i in range(events // 3):
            rows.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "aten::mm",
                    "pid": 1,
                    "tid": 1,
                    "ts": t,
                    "dur": 5.0,
                    "args": {"External id": i},
                }  # fmt: skip
            )
            rows.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": 1,
                    "tid": 1,
                    "ts": t + 1,
                    "dur": 3.0,
                    "args": {"correlation": i},
                }  # fmt: skip
            )
            rows.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": names[i % 50],
                    "pid": 0,
                    "tid": 7,
                    "ts": t + 6,
                    "dur": 4.0,
                    "args": {"device": 0, "stream": 7, "correlation": i},
                }  # fmt: skip
            )
            t += 10
            if len(rows) > 30_000:
                f.write(",\n".join(json.dumps(r) for r in rows) + ",\n")
                rows = []
        f.write(",\n".join(json.dumps(r) for r in rows) + "\n]}\n")


def measure(args: list[str], src: str | None) -> dict:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run(
        [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env
    )
    return json.loads(run.stderr.strip().splitlines()[-1])


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}, {max(values):.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--events", type=int, nargs="*", default=[1_000_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", metavar="SRC", help="another tree's src/ to compare")
    parser.add_argument("--keep", metavar="DIR", help="keep the inputs here")
    options = parser.parse_args()
    base = Path(options.keep or tempfile.mkdtemp(prefix="trial-trace-scale-"))
    inputs = []
    for steps in options.steps:
        root = base / f"trial-{steps}"
        if not root.exists():
            write_trial(root, steps)
        inputs.append((f"replay, {steps:,} saved steps", ["replay", str(root), "--json", "-"]))
    for events in options.events:
        path = base / f"trace-{events}.pt.trace.json.gz"
        if not path.exists():
            write_trace(path, events)
        inputs.append((f"trace summarize, {events:,} events", ["trace", "summarize", str(path)]))
    variants = [("before", options.before), ("after", None)] if options.before else [("", None)]
    print(f"load average at start: {os.getloadavg()}", flush=True)
    for label, command in inputs:
        results: dict[str, list[dict]] = {name: [] for name, _ in variants}
        for _ in range(options.rounds):
            for name, src in variants:  # interleaved: each round runs every variant once
                results[name].append(measure(command, src))
        for name, runs in results.items():
            print(
                f"{label} {name}: exit {sorted({r['code'] for r in runs})}, wall s "
                f"{_spread([r['wall'] for r in runs])}, CPU s "
                f"{_spread([r['cpu'] + r['promtool_cpu'] for r in runs])}, peak RSS MB "
                f"{_spread([r['rss_mb'] for r in runs])}, promtool peak RSS MB "
                f"{_spread([r['promtool_rss_mb'] for r in runs])}",
                flush=True,
            )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()

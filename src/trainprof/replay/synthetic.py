"""Write SageMaker Debugger profiler output from a script of what the hosts did.

For tests, benchmarks and the demo: the files have SageMaker's layout, names, line format and
quirks (percent values with two decimals, metric groups of one sample microseconds apart,
minute files per node, `training_job_end.ts` markers), so `trainprof replay` reads them
exactly as it reads real output.

    write_system(out, start=1700000000, duration=600, interval=0.5, hosts={
        "algo-1": {"cores": 4, "gpus": 2,
                   "timeline": [{"gpu_util": 0.05, "cpu": [0.95, 0.2, 0.2, 0.2]},
                                {"from": 300, "gpu_util": 0.9}]}})

Values are ratios 0..1: a number (every core/GPU), a list (one per core/GPU) or
{"cycle": [...]} (one value per sample, repeating).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

from trainprof.contract.durations import parse_duration

HEALTHY = {"cpu": 0.3, "iowait": 0.0, "gpu_util": 0.9, "gpu_mem": 0.5, "mem": 0.3}


def values_at(spec: Any, count: int, k: int) -> list[float]:
    """The per-device values of a timeline entry at sample number k."""
    if isinstance(spec, list):
        if len(spec) != count:
            raise ValueError(f"{spec} does not hold one value per device ({count})")
        return [values_at(s, 1, k)[0] for s in spec]
    if isinstance(spec, Mapping):
        cycle = spec["cycle"]
        return [float(cycle[k % len(cycle)])] * count
    return [float(spec)] * count


def _start(entry: Mapping[str, Any]) -> float:
    """An entry's `from`: seconds as a number (this is a test-data helper), or "5m"."""
    value = entry.get("from", 0)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return parse_duration(value)


def segment_at(timeline: list[Mapping[str, Any]], t: float) -> dict[str, Any]:
    """The values in force `t` seconds after the start (later entries win)."""
    current = dict(HEALTHY)
    for entry in sorted(timeline, key=_start):
        if _start(entry) <= t + 1e-9:
            current = {**HEALTHY, **{k: v for k, v in entry.items() if k != "from"}}
    return current


def _line(kind: str, name: str, dimension: str, value: float, node: str, ts: float) -> str:
    return (
        f'{{"Type":"{kind}","Name":"{name}","Dimension":"{dimension}",'
        f'"Value":{value * 100:.2f},"NodeId":"{node}","Timestamp":{ts:.6f}}}\n'
    )


def write_system(
    out: str, start: float, duration: float, interval: float, hosts: Mapping[str, Mapping[str, Any]]
) -> int:
    """Write system/incremental minute files under `out`; return the number of lines."""
    lines = 0
    samples = int(math.floor(duration / interval + 1e-9))
    for node, host in hosts.items():
        cores, gpus = host.get("cores", 4), host.get("gpus", 1)
        timeline = host.get("timeline", [{}])
        files: dict[int, Any] = {}
        try:
            for k in range(1, samples + 1):
                rel = k * interval
                ts = start + rel
                minute = int(ts // 60 * 60)
                stream = files.get(minute)
                if stream is None:
                    hour = _hour(minute)
                    folder = os.path.join(out, "system", "incremental", hour)
                    os.makedirs(folder, exist_ok=True)
                    for old in files.values():
                        old.close()
                    files = {minute: open(os.path.join(folder, f"{minute}.{node}.json"), "w")}
                    stream = files[minute]
                seg = segment_at(timeline, rel)
                util = values_at(seg["gpu_util"], gpus, k)
                mem = values_at(seg["gpu_mem"], gpus, k)
                chunk = []
                for j in range(gpus):
                    chunk.append(_line("gpu", f"gpu{j}", "GPUUtilization", util[j], node, ts))
                    chunk.append(_line("gpu", f"gpu{j}", "GPUMemoryUtilization", mem[j], node, ts))
                chunk.append(
                    _line(
                        "memory",
                        "MemoryUsedPercent",
                        "",
                        values_at(seg["mem"], 1, k)[0],
                        node,
                        ts + 0.0006,
                    )
                )
                cpu = values_at(seg["cpu"], cores, k)
                iowait = values_at(seg["iowait"], cores, k)
                for i in range(cores):
                    chunk.append(
                        _line("cpu", f"cpu{i}", "CPUUtilization", cpu[i], node, ts + 0.0009)
                    )
                    chunk.append(
                        _line("cpu", f"cpu{i}", "I/OWaitPercentage", iowait[i], node, ts + 0.0009)
                    )
                stream.write("".join(chunk))
                lines += len(chunk)
        finally:
            for stream in files.values():
                stream.close()
    open(os.path.join(out, "system", "training_job_end.ts"), "w").close()
    return lines


def write_steps(out: str, node: str, rank: int, steps: list[tuple[str, float, float]]) -> str:
    """Write one rank's steps [(mode, start, end) in Unix seconds] as a python timeline
    trace, relative to a start_time_since_epoch_in_micros as SageMaker's hook did."""
    base = int(min(s[1] for s in steps) * 1e6) - 1_000_000 if steps else 0
    end_us = int(max(s[2] for s in steps) * 1e6) if steps else base
    events = [
        {
            "name": "process_name",
            "ph": "M",
            "pid": 0,
            "args": {"start_time_since_epoch_in_micros": base},
        }
    ]
    for number, (mode, begin, end) in enumerate(steps):
        name = f"Step:ModeKeys.{mode.upper()}"
        events.append(
            {
                "name": name,
                "pid": 1,
                "ph": "X",
                "ts": int(begin * 1e6) - base,
                "dur": int((end - begin) * 1e6),
                "args": {"step_num": str(number)},
            }
        )
    folder = os.path.join(out, "framework", "pevents", _hour(base / 1e6))
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{end_us}_{rank}-{node}_pythontimeline.json")
    with open(path, "w") as f:
        f.write("[\n" + ",\n".join(json.dumps(e) for e in events) + "\n]\n")
    return path


def _hour(ts: float) -> str:
    import time

    return time.strftime("%Y%m%d%H", time.gmtime(ts))

"""trainprof's own recording format: what `trainprof exporter --record` writes and
`trainprof replay` reads.

JSON lines, one record per line, optionally gzip-compressed (a `.gz` suffix):

    {"kind": "meta", "version": 1, "datapoint_interval": 0.5, "writer": "trainprof 0.1.0"}
    {"kind": "host", "node": "n1", "t": 1700000000.5, "cpu": [0.5, 0.7], "iowait": [0.0, 0.1],
     "mem": 0.31, "gpus": [{"index": 0, "uuid": "GPU-a", "util": 0.9, "mem": 0.5}]}

    {"kind": "process", "node": "n1", "rank": 0, "start": 1700000000.1}
    {"kind": "step", "node": "n1", "rank": 0, "mode": "train", "start": 1700000012.3,
     "end": 1700000012.5}

Host records carry exactly what `SampleAccumulator` needs (ratios 0..1); process and step
records what `TrainingState` needs (`trainprof.start(record=...)` writes them). Readers skip
kinds they do not know and report a malformed line with its path and line number.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
from collections.abc import Iterator
from typing import IO, Any

from trainprof.sampling import GpuSample, HostSample

VERSION = 1
_GPU_FIELDS = {
    "util": "utilization",
    "mem": "memory_used_ratio",
    "mem_used": "memory_used_bytes",
    "mem_total": "memory_total_bytes",
    "power": "power_watts",
    "energy": "energy_joules",
    "temperature": "temperature_celsius",
    "sm_clock": "sm_clock_hertz",
}


class RecordingError(ValueError):
    """A recording that cannot be read; the message names the file and line."""


def open_recording(path: str, mode: str = "r") -> IO[str]:
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.GzipFile(path, mode + "b"), encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def meta(datapoint_interval: float, writer: str) -> dict[str, Any]:
    return {
        "kind": "meta",
        "version": VERSION,
        "datapoint_interval": datapoint_interval,
        "writer": writer,
    }


def host_record(node: str, sample: HostSample) -> dict[str, Any]:
    record: dict[str, Any] = {"kind": "host", "node": node, "t": sample.timestamp}
    if sample.cpu_utilization:
        record["cpu"] = list(sample.cpu_utilization)
    if sample.cpu_iowait:
        record["iowait"] = list(sample.cpu_iowait)
    memory = sample.memory_ratio()
    if memory is not None:
        record["mem"] = memory
    gpus = []
    for gpu in sample.gpus:
        entry: dict[str, Any] = {"index": gpu.index, "uuid": gpu.uuid}
        for key, attr in _GPU_FIELDS.items():
            value = getattr(gpu, attr)
            if value is not None:
                entry[key] = value
        gpus.append(entry)
    if gpus:
        record["gpus"] = gpus
    return record


def process_record(node: str, rank: int, start: float) -> dict[str, Any]:
    return {"kind": "process", "node": node, "rank": rank, "start": start}


def step_record(node: str, rank: int, mode: str, start: float, end: float) -> dict[str, Any]:
    return {"kind": "step", "node": node, "rank": rank, "mode": mode, "start": start, "end": end}


def host_sample(record: dict[str, Any]) -> HostSample:
    """The HostSample of a host record (raises KeyError/TypeError/ValueError if malformed)."""
    gpus = []
    for g in record.get("gpus", []):
        kwargs: dict[str, Any] = {
            attr: float(g[key]) for key, attr in _GPU_FIELDS.items() if key in g
        }
        gpus.append(GpuSample(int(g["index"]), str(g.get("uuid", "")), **kwargs))
    return HostSample(
        timestamp=float(record["t"]),
        cpu_utilization=[float(v) for v in record.get("cpu", [])],
        cpu_iowait=[float(v) for v in record.get("iowait", [])],
        memory_used_ratio=float(record["mem"]) if "mem" in record else None,
        gpus=gpus,
    )


@dataclasses.dataclass
class Writer:
    """Appends records to an open text stream, one JSON object per line."""

    stream: IO[str]

    def write(self, record: dict[str, Any]) -> None:
        self.stream.write(json.dumps(record, separators=(",", ":")) + "\n")


def read(path: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for every record of a recording file."""
    try:
        with open_recording(path) as stream:
            for number, line in enumerate(stream, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise RecordingError(f"{path}:{number}: not JSON: {e.msg}") from None
                if not isinstance(record, dict) or "kind" not in record:
                    raise RecordingError(f"{path}:{number}: expected an object with a kind")
                yield number, record
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise RecordingError(f"{path}: cannot read: {e}") from None
    except UnicodeDecodeError:
        raise RecordingError(f"{path}: not a text recording") from None

"""Read one Kineto trace (what `torch.profiler` writes: Chrome trace JSON, often gzip) into
the few event kinds the summary needs, with times in integer nanoseconds.

    >>> t = read_trace("tests/data/real-gpu-traces/a100-alexnet.pt.trace.json.gz")
    >>> t.rank, len(t.device), t.device[0].kind, t.device[0].name
    (0, 98, 'memcpy', 'Memcpy HtoD (Pageable -> Device)')

Bad input raises `TraceError` naming the file and what is wrong with it; single malformed
events are skipped and counted in `Trace.skipped`, never refusing the whole trace.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Kineto has written both spellings over the years ("Kernel" before PyTorch 1.10).
DEVICE_CATEGORIES = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
}
LAUNCH_CATEGORIES = {"cuda_runtime", "cuda_driver", "runtime"}
SYNC_CATEGORY = "cuda_sync"


class TraceError(ValueError):
    """A trace file that cannot be read at all: the message names the file and the reason."""


@dataclass(frozen=True, slots=True)
class DeviceEvent:
    """One kernel, memcpy or memset as the GPU ran it."""

    name: str
    kind: str  # kernel | memcpy | memset
    start: int  # ns
    end: int  # ns
    device: int
    stream: int
    correlation: int | None
    nbytes: int | None


@dataclass(frozen=True, slots=True)
class Span:
    """A named host-side interval: a CPU op, a user annotation, a launch call, a sync."""

    name: str
    start: int  # ns
    end: int  # ns


@dataclass
class Trace:
    path: str
    rank: int
    device: list[DeviceEvent] = field(default_factory=list)
    launches: dict[int, Span] = field(default_factory=dict)  # correlation -> runtime call
    syncs: list[Span] = field(default_factory=list)
    cpu_ops: list[Span] = field(default_factory=list)
    annotations: list[Span] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0


def _ns(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(value)
    return round(value * 1000)


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _open_json(path: Path) -> Any:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise TraceError(f"{path}: damaged or truncated gzip ({e})") from None
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a JSON trace (not UTF-8 text)") from None
    except json.JSONDecodeError as e:
        where = f"line {e.lineno} column {e.colno}"
        hint = " (truncated?)" if e.pos >= len(raw.rstrip()) else ""
        raise TraceError(f"{path}: not valid JSON at {where}{hint}: {e.msg}") from None


def _rank(doc: dict, path: Path) -> int:
    info = doc.get("distributedInfo")
    if not isinstance(info, dict) or "rank" not in info:
        return 0
    rank = _int_or_none(info["rank"])
    if rank is None or rank < 0:
        raise TraceError(f"{path}: distributedInfo.rank is {info['rank']!r}, not a rank number")
    return rank


def read_trace(path: str | Path) -> Trace:
    """Parse one trace file; raise TraceError when it is not a Kineto trace at all."""
    path = Path(path)
    doc = _open_json(path)
    if isinstance(doc, list):  # the bare-array form of the Chrome trace format
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError(f"{path}: no traceEvents list: not a PyTorch profiler (Kineto) trace")
    trace = Trace(path=str(path), rank=_rank(doc, path))
    gpus = doc.get("deviceProperties")
    if isinstance(gpus, list):
        trace.gpus = [g for g in gpus if isinstance(g, dict)]
    for event in doc["traceEvents"]:
        try:
            _add(trace, event)
        except (ValueError, TypeError, KeyError, AttributeError):
            trace.skipped += 1
    return trace


def _add(trace: Trace, event: Any) -> None:
    if event.get("ph") != "X":
        return
    category = event.get("cat")
    if not isinstance(category, str):
        return
    category = category.lower()
    name = event["name"]
    if not isinstance(name, str):
        raise TypeError(name)
    start = _ns(event["ts"])
    duration = _ns(event["dur"])
    if duration < 0:
        raise ValueError(duration)
    end = start + duration
    args = event.get("args") or {}
    kind = DEVICE_CATEGORIES.get(category)
    if kind is not None:
        trace.device.append(
            DeviceEvent(
                name=name,
                kind=kind,
                start=start,
                end=end,
                device=_int_or_none(args.get("device")) or 0,
                stream=_int_or_none(args.get("stream")) or 0,
                correlation=_int_or_none(args.get("correlation")),
                nbytes=_int_or_none(args.get("bytes")),
            )
        )
    elif category in LAUNCH_CATEGORIES:
        correlation = _int_or_none(args.get("correlation"))
        if correlation is not None:
            # a runtime call and the driver call inside it share a correlation: the launch
            # began with the outer (earlier) one
            known = trace.launches.get(correlation)
            if known is None or start < known.start:
                trace.launches[correlation] = Span(name, start, end)
    elif category == SYNC_CATEGORY:
        trace.syncs.append(Span(name, start, end))
    elif category == "cpu_op":
        trace.cpu_ops.append(Span(name, start, end))
    elif category == "user_annotation":
        trace.annotations.append(Span(name, start, end))

"""Read one Kineto trace (what `torch.profiler` writes: Chrome trace JSON, often gzip) into
the few event kinds the summary needs, with times in integer nanoseconds.

    >>> t = read_trace("tests/data/real-gpu-traces/a100-alexnet.pt.trace.json.gz")
    >>> t.rank, len(t.device), t.device[0].kind, t.device[0].name
    (0, 98, 'memcpy', 'Memcpy HtoD (Pageable -> Device)')

Bad input raises `TraceError` naming the file and what is wrong with it; single malformed
events are skipped and counted in `Trace.skipped`, never refusing the whole trace.

The file is decompressed and parsed a chunk at a time, one event at a time (`_Json`), so
what a trace costs in memory is the events the summary keeps, not the JSON text or a
dictionary per event. Bounds, each a `TraceError` naming the file: text past
`MAX_TRACE_BYTES` (a small gzip can expand to gigabytes), one event or value past
`MAX_VALUE_BYTES`, and nesting deeper than Python's `json` parses.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

# Trace text (after gzip) read at most: 2 GiB is ten million Kineto events.
MAX_TRACE_BYTES = 2 << 30
# One event, or one top-level value beside traceEvents, at most.
MAX_VALUE_BYTES = 16 << 20
_CHUNK = 1 << 20
_NOT_SPACE = re.compile(r"[^ \t\n\r]")

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
    # one str per distinct name, shared by every event of that name (a million events of a
    # few hundred names keep a few hundred strings, not a million)
    names: dict[str, str] = field(default_factory=dict, repr=False)


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


class _Json:
    """A JSON document read a chunk at a time: `value()` parses the next value whole,
    `char()` the next structural character; offsets are kept for messages."""

    def __init__(self, path: Path, chunks: Iterator[str]):
        self.path = path
        self._chunks = chunks
        self._decode = json.JSONDecoder().raw_decode
        self.buf, self.pos, self.eof = "", 0, False
        self._lines = 0  # lines before buf
        self._column = 0  # characters of buf's first line before buf

    def _fill(self) -> bool:
        if self.eof:
            return False
        chunk = next(self._chunks, None)
        if chunk is None:
            self.eof = True
            return False
        if self.pos:
            newlines = self.buf.count("\n", 0, self.pos)
            if newlines:
                self._lines += newlines
                self._column = self.pos - self.buf.rfind("\n", 0, self.pos) - 1
            else:
                self._column += self.pos
            self.buf, self.pos = self.buf[self.pos :], 0
        self.buf += chunk
        return True

    def peek(self) -> str:
        """The next character that is not white space ("" at the end)."""
        while True:
            found = _NOT_SPACE.search(self.buf, self.pos)
            self.pos = found.start() if found else len(self.buf)
            if found or not self._fill():
                return self.buf[self.pos : self.pos + 1]

    def char(self, allowed: str) -> str:
        c = self.peek()
        if not c or c not in allowed:
            self.fail(f"expected {' or '.join(repr(a) for a in allowed)}")
        self.pos += 1
        return c

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                value, end = self._decode(self.buf, self.pos)
            except RecursionError:
                raise TraceError(f"{self.path}: not a JSON trace (nested too deeply)") from None
            except json.JSONDecodeError as e:
                if self.eof:
                    self.fail(e.msg, e.pos)
                value, end = None, -1
            # a value that ends where the text read so far ends may go on (a number)
            if end != -1 and (end < len(self.buf) or self.eof):
                self.pos = end
                return value
            if len(self.buf) - self.pos > MAX_VALUE_BYTES:
                raise TraceError(
                    f"{self.path}: a value at {self.where(self.pos)} runs past "
                    f"{MAX_VALUE_BYTES >> 20} MiB: not a Kineto trace"
                )
            if not self._fill():
                self.eof = True

    def where(self, pos: int) -> str:
        line = self._lines + self.buf.count("\n", 0, pos) + 1
        newline = self.buf.rfind("\n", 0, pos)
        column = pos - newline if newline >= 0 else self._column + pos + 1
        return f"line {line} column {column}"

    def fail(self, message: str, pos: int | None = None) -> None:
        pos = self.pos if pos is None else pos
        hint = " (truncated?)" if self.eof and pos >= len(self.buf.rstrip()) else ""
        raise TraceError(f"{self.path}: not valid JSON at {self.where(pos)}{hint}: {message}")


def _text(path: Path) -> Iterator[str]:
    """The file's text a chunk at a time, gunzipped when it is gzip; at most MAX_TRACE_BYTES."""
    try:
        raw = open(path, "rb")
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    with raw:
        zipped = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        stream: IO[bytes] | gzip.GzipFile = gzip.GzipFile(fileobj=raw) if zipped else raw
        decoder = codecs.getincrementaldecoder("utf-8")()
        total = 0
        while True:
            try:
                data = stream.read(_CHUNK)
            except (OSError, EOFError, zlib.error) as e:
                raise TraceError(f"{path}: damaged or truncated gzip ({e})") from None
            total += len(data)
            if total > MAX_TRACE_BYTES:
                raise TraceError(
                    f"{path}: more than {MAX_TRACE_BYTES >> 30} GiB of trace text (after gzip): "
                    "not read further"
                )
            try:
                text = decoder.decode(data, final=not data)
            except UnicodeDecodeError:
                raise TraceError(f"{path}: not a JSON trace (not UTF-8 text)") from None
            if not data:
                return
            yield text


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
    reader = _Json(path, _text(path))
    trace = Trace(path=str(path), rank=0)
    doc: dict[str, Any] = {}
    events = 0
    first = reader.peek()
    if first == "[":  # the bare-array form of the Chrome trace format
        events += _events(reader, trace)
    elif first == "{":
        reader.char("{")
        if reader.peek() != "}":
            while True:
                key = reader.value()
                reader.char(":")
                if key == "traceEvents" and reader.peek() == "[":
                    events += _events(reader, trace)
                    doc[key] = True
                else:
                    doc[key] = reader.value()
                if reader.char(",}") == "}":
                    break
        else:
            reader.char("}")
    elif first:
        reader.fail("not a JSON object or array")
    if reader.peek():
        reader.fail("extra data after the trace")
    if first == "{" and doc.get("traceEvents") is not True or not first:
        raise TraceError(f"{path}: no traceEvents list: not a PyTorch profiler (Kineto) trace")
    trace.rank = _rank(doc, path)
    gpus = doc.get("deviceProperties")
    if isinstance(gpus, list):
        trace.gpus = [g for g in gpus if isinstance(g, dict)]
    return trace


def _events(reader: _Json, trace: Trace) -> int:
    """Read a JSON array of events one at a time into `trace`; how many there were."""
    reader.char("[")
    if reader.peek() == "]":
        reader.char("]")
        return 0
    count = 0
    while True:
        event = reader.value()
        count += 1
        try:
            _add(trace, event)
        except (ValueError, TypeError, KeyError, AttributeError):
            trace.skipped += 1
        if reader.char(",]") == "]":
            return count


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
    name = trace.names.setdefault(name, name)
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

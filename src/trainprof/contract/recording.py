"""trainprof's own recording format: what `trainprof exporter --record` writes and
`trainprof replay` reads.

JSON lines, one record per line, optionally gzip-compressed (a `.gz` suffix):

    {"kind": "meta", "version": 1, "datapoint_interval": 0.5, "writer": "trainprof 0.1.0"}
    {"kind": "host", "node": "n1", "t": 1700000000.5, "cpu": [0.5, 0.7], "iowait": [0.0, 0.1],
     "mem": 0.31, "gpus": [{"index": 0, "uuid": "GPU-a", "util": 0.9, "mem": 0.5}]}

    {"kind": "process", "node": "n1", "rank": 0, "start": 1700000000.1,
     "training_job": "bert-large"}
    {"kind": "step", "node": "n1", "rank": 0, "mode": "train", "start": 1700000012.3,
     "end": 1700000012.5}
    {"kind": "phases", "node": "n1", "rank": 0, "t": 1700000013.0,
     "seconds": {"dataloader": 0.8, "forward": 3.1, "backward": 5.9, ...}}
    {"kind": "end", "node": "n1", "rank": 0, "t": 1700003600.2}

Host records carry exactly what `SampleAccumulator` needs (ratios 0..1); process, step and
phases records what `TrainingState` needs (`trainprof.start(record=...)` writes them; a
phases record holds the rank's cumulative seconds per phase at `t`, so the last one wins).
An end record says when the rank's recording was closed: its process stopped serving
metrics then (`trainprof.stop()`, exit, SIGTERM); a rank killed with `kill -9` leaves none.
Readers skip kinds they do not know and report a malformed line with its path and line
number.

Writers (`Appender`) append whole lines at each flush, and a `.gz` file gets one complete
gzip member per flush (concatenated members are one valid gzip stream), so a process killed
with `kill -9` leaves a readable file that lacks at most what came after the last flush.
Recorders still open are flushed and closed at interpreter exit and on SIGTERM
(`close_at_exit`).
"""

from __future__ import annotations

import atexit
import dataclasses
import gzip
import io
import json
import logging
import os
import signal
import threading
import weakref
from collections.abc import Iterator
from typing import IO, Any

from trainprof.contract.names import JOB_LABEL
from trainprof.contract.sampling import GpuSample, HostSample

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


def process_record(
    node: str, rank: int, start: float, training_job: str | None = None
) -> dict[str, Any]:
    record: dict[str, Any] = {"kind": "process", "node": node, "rank": rank, "start": start}
    if training_job:
        record[JOB_LABEL] = training_job
    return record


def phases_record(node: str, rank: int, t: float, seconds: dict[str, float]) -> dict[str, Any]:
    return {"kind": "phases", "node": node, "rank": rank, "t": t, "seconds": dict(seconds)}


def end_record(node: str, rank: int, t: float) -> dict[str, Any]:
    return {"kind": "end", "node": node, "rank": rank, "t": t}


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


class Appender:
    """Appends records to a recording file, whole lines per `flush()` (see the module doc).

    Creates the file's folder when it does not exist yet (`runs/today/x.jsonl.gz`); raises
    OSError when the folder or the file cannot be created. Thread-safe.
    """

    def __init__(self, path: str):
        self.path = path
        self._gzip = path.endswith(".gz")
        folder = os.path.dirname(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        self._file: IO[bytes] | None = open(path, "wb")
        self._pending: list[str] = []
        self._lock = threading.RLock()  # SIGTERM's handler may flush on a flushing thread

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            self._pending.append(line)

    def flush(self) -> None:
        """Write what was appended since the last flush; raises OSError (a full disk)."""
        with self._lock:
            lines, self._pending = self._pending, []
            if self._file is None or not lines:
                return
            data = "".join(lines).encode("utf-8")
            self._file.write(gzip.compress(data, compresslevel=6, mtime=0) if self._gzip else data)
            self._file.flush()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            with self._lock:
                file, self._file = self._file, None
            if file is not None:
                file.close()

    def abandon(self) -> None:
        """Close the file without writing what is pending (a forked child, a failed disk)."""
        with self._lock:
            file, self._file, self._pending = self._file, None, []
        if file is not None:
            try:
                file.close()  # its buffer is empty: every flush() flushed it
            except OSError:
                pass

    @property
    def closed(self) -> bool:
        return self._file is None


_open: weakref.WeakSet = weakref.WeakSet()  # objects with close(), closed at exit
_exit_lock = threading.Lock()
_exit_hooked = False
_log = logging.getLogger("trainprof")


def close_at_exit(closable: Any) -> None:
    """Close `closable` (a recorder: `close()` flushes) at interpreter exit (normal end,
    `sys.exit`, an uncaught exception, SIGINT) and on SIGTERM.

    SIGTERM: when its handler is the default one, trainprof's handler closes the
    recordings and then dies of SIGTERM as before; when the program installed its own
    handler, that handler is left alone (its exit runs the atexit hook).
    """
    global _exit_hooked
    _open.add(closable)
    with _exit_lock:
        if _exit_hooked:
            return
        _exit_hooked = True
    atexit.register(close_all)
    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):  # not the main interpreter
            pass


def close_all() -> None:
    for closable in list(_open):
        try:
            closable.close()
        except Exception as e:  # noqa: BLE001 - one recording must not keep the others open
            _log.warning("trainprof: closing the recording %s failed: %s", closable, e)


def _on_sigterm(signum: int, frame: Any) -> None:
    close_all()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


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

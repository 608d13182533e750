"""Reading trainprof recordings for replay, up to the damage.

A trainer killed mid-write leaves a gzip without its end, or a last line cut in half; a disk
error can leave a garbled line in the middle. Replay reads every line it can, skips the
damaged ones with their file and line, and says how much of a truncated file it read:

    note: read 403 lines of rec.jsonl.gz, then it ends early (truncated: the writer
          did not close it); the rest of the recording is lost
"""

from __future__ import annotations

import gzip
import math
import os
import zlib
from collections.abc import Iterator
from typing import Any

from trainprof.contract import recording
from trainprof.contract.names import JOB_LABEL
from trainprof.contract.sampling import HostSample
from trainprof.replay.damage import Damage, json_object, ratio, timestamp_ok
from trainprof.replay.timeline import PhaseTotals, Step
from trainprof.training.state import bounded_label_value, canonical_mode

# No record is longer than this (a host of 192 cores and 8 GPUs writes about 5 KB a line).
MAX_LINE = 1 << 20


def _rest_of_line(stream) -> bool:
    """Read on through an overlong line a piece at a time; False once it has ended."""
    piece = stream.readline(MAX_LINE)
    return bool(piece) and not piece.endswith("\n")


def records(path: str, damage: Damage) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) of every readable line of `path`."""
    number = 0
    try:
        with recording.open_recording(path) as stream:
            while True:
                try:
                    line = stream.readline(MAX_LINE + 1)
                    long = len(line) > MAX_LINE and not line.endswith("\n")
                    while long and _rest_of_line(stream):
                        pass
                except UnicodeDecodeError:
                    number += 1
                    damage.skip("not text", f"{path}:{number}")
                    return
                if not line:
                    return
                number += 1
                if long:
                    where = f"{path}:{number}"
                    damage.skip(f"longer than {MAX_LINE >> 20} MiB (no record is)", where)
                    continue
                if not line.strip():
                    continue
                record = json_object(line, f"{path}:{number}", damage, required="kind")
                if record is not None:
                    yield number, record
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        name = os.path.basename(path)
        if number == 0:
            damage.skip("files not readable", f"{path} ({e})")
        else:
            damage.read.append(
                f"read {number} line(s) of {name}, then it ends early ({e}: the writer did "
                "not close it); the rest of that file is lost"
            )
    except OSError as e:
        damage.skip("files not readable", f"{path} ({e.strerror or e})")


def host_sample(record: dict[str, Any], where: str, damage: Damage) -> HostSample | None:
    """The host record's sample, with ratios checked; None (reported) if unusable."""
    try:
        sample = recording.host_sample(record)
    except (KeyError, TypeError, ValueError, OverflowError):
        damage.skip("host records without a time or with non-numeric values", where)
        return None
    if not _dated(sample.timestamp, "with a timestamp", where, damage):
        return None
    lists: list[list[float]] = []
    for values in (sample.cpu_utilization, sample.cpu_iowait):
        checked = [ratio(v, where, damage, "values") for v in values]
        kept = [v for v in checked if v is not None]
        if len(kept) != len(checked):
            return None
        lists.append(kept)
    sample.cpu_utilization, sample.cpu_iowait = lists
    if sample.memory_used_ratio is not None:
        sample.memory_used_ratio = ratio(sample.memory_used_ratio, where, damage, "values")
        if sample.memory_used_ratio is None:
            return None
    for gpu in sample.gpus:
        for attr in ("utilization", "memory_used_ratio"):
            value = getattr(gpu, attr)
            if value is not None:
                value = ratio(value, where, damage, "values")
                if value is None:
                    return None
                setattr(gpu, attr, value)
    return sample


def step(record: dict[str, Any], where: str, damage: Damage) -> Step | None:
    try:
        result = Step(
            str(record["node"]),
            int(record["rank"]),
            canonical_mode(record["mode"]),
            float(record["start"]),
            float(record["end"]),
        )
    except (KeyError, TypeError, ValueError, OverflowError):
        damage.skip("step records without node, rank, mode, start or end", where)
        return None
    if not (timestamp_ok(result.start) and timestamp_ok(result.end) and result.end >= result.start):
        damage.skip("step records with times outside 2000..2100", where)
        return None
    return result


def _dated(t: float, what: str, where: str, damage: Damage) -> bool:
    """Whether `t` lies in 2000..2100; where not, the record is skipped, reported as `what`
    (records with a time) outside that range."""
    if timestamp_ok(t):
        return True
    damage.skip(f"{what} outside 2000..2100", where)
    return False


def _rank_time(
    record: dict[str, Any], where: str, damage: Damage, kind: str, field: str, noun: str
) -> tuple[tuple[str, int], float] | None:
    """((node, rank), the time in `field`) of a record of `kind`, or None (reported)."""
    try:
        key, t = (str(record["node"]), int(record["rank"])), float(record[field])
    except (KeyError, TypeError, ValueError, OverflowError):
        damage.skip(f"{kind} records without node, rank or {field}", where)
        return None
    return (key, t) if _dated(t, f"{kind} records with {noun}", where, damage) else None


def process_start(record: dict[str, Any], where: str, damage: Damage):
    """((node, rank), start) of a process record, or None (reported)."""
    return _rank_time(record, where, damage, "process", "start", "a start")


def process_end(record: dict[str, Any], where: str, damage: Damage):
    """((node, rank), t) of an end record, or None (reported)."""
    return _rank_time(record, where, damage, "end", "t", "a time")


def phase_totals(record: dict[str, Any], where: str, damage: Damage) -> PhaseTotals | None:
    """The phases record's totals, or None (reported) if unusable: a time outside
    2000..2100, or seconds that are not finite numbers of at least 0."""
    try:
        seconds = record["seconds"]
        if not isinstance(seconds, dict):
            raise TypeError("seconds is not an object")
        result = PhaseTotals(
            str(record["node"]),
            int(record["rank"]),
            float(record["t"]),
            tuple((str(name), float(value)) for name, value in seconds.items()),
        )
    except (KeyError, TypeError, ValueError, OverflowError):
        damage.skip("phases records without node, rank, t or seconds", where)
        return None
    if not _dated(result.t, "phases records with a time", where, damage):
        return None
    if not all(math.isfinite(v) and v >= 0 for _, v in result.seconds):
        damage.skip("phases records with negative, NaN or infinite seconds", where)
        return None
    return result


def training_job(record: dict[str, Any]) -> str | None:
    """The job a process record names (`trainprof.start(training_job=...)`), if any, as
    the rank's own series carried it (a long name cut as `bounded_label_value` cuts it)."""
    name = record.get(JOB_LABEL)
    return bounded_label_value(name) if isinstance(name, str) and name.strip() else None

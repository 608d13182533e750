"""Read SageMaker Debugger profiler output: system metrics and framework step traces.

profiler-output/system/incremental/[<YYYYMMDDHH>/]<minute>.algo-<N>.json
    JSON lines {"Type","Name","Dimension","Value","NodeId","Timestamp"}, one per metric
    per sample; CPUUtilization and I/OWaitPercentage per core (cpu<i>), GPUUtilization and
    GPUMemoryUtilization per GPU (gpu<j>), MemoryUsedPercent per node, all in percent.
profiler-output/framework/pevents/<YYYYMMDDHH>/<end_us>_<rank>-<node>_pythontimeline.json
    Chrome traces; a step is an "X" event whose name contains "Step:ModeKeys"; event times
    are microseconds after the trace's start_time_since_epoch_in_micros.

>>> resources = "tests/data/real-sagemaker/smdebug-test-resources/tests/profiler/resources/"
>>> samples = read_system(find_profiler_output(resources + "test_traces"))
>>> samples.by_node["algo-1"][0].cpu_utilization[:2]
[0.016, 0.193]
>>> read_steps(find_profiler_output(resources + "merge_traces"))[0]
Step(node='b88ab1bb8259', rank=905, mode='train', start=1594662608.090195, end=1594662617.11092)
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
import operator
import os
import re
from collections.abc import Sequence

from trainprof.contract.sampling import HostSample
from trainprof.replay.compact import CompactSamples
from trainprof.replay.damage import EARLIEST, LATEST, Damage, json_object, ratio, timestamp_ok
from trainprof.replay.timeline import Step
from trainprof.training.state import canonical_mode

SYSTEM_FILE = re.compile(r"^(\d+)\.(algo-\d+)\.json$")
TRACE_FILE = re.compile(r"^(\d+)_(\d+)-(.+)_pythontimeline\.json$")
_CORE = re.compile(r"^cpu(\d+)$")
_GPU = re.compile(r"^gpu(\d+)$")
# SageMaker wrote the metric groups of one sample microseconds apart; events this close
# together belong to one sample (the original rules clustered within 20 ms too).
SNAPSHOT_SPREAD = 0.02
# Where ProfilerReport wrote one JSON per rule: ProfilerReport/profiler-output/<this>/.
REPORTS_DIR = "profiler-reports"
# Larger files are skipped unread: a minute of system metrics from a 192-core, 8-GPU host
# sampled every 100 ms (the most SageMaker offers) is about 30 MB; smdebug rotates its
# framework traces long before this size.
MAX_SYSTEM_FILE_BYTES = 128 << 20
MAX_TRACE_FILE_BYTES = 256 << 20
# Dimensions SageMaker wrote that no profiler rule reads (disk and network throughput).
_UNUSED_TYPES = {"i/o", "network"}


class SourceError(ValueError):
    """A profiler output that cannot be read; the message names the file (and line)."""


@dataclasses.dataclass
class ProfilerOutput:
    root: str
    system_files: list[tuple[int, str, str]]  # (minute, node, path), in time order
    trace_files: list[tuple[int, str, int, str]]  # (end_us, node, rank, path)
    ignored: list[str]


@dataclasses.dataclass
class SystemSamples:
    by_node: dict[str, Sequence[HostSample]]
    lines: int = 0
    unused: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    unknown: collections.Counter = dataclasses.field(default_factory=collections.Counter)


def looks_like_sagemaker(path: str) -> bool:
    if not os.path.isdir(path):
        return False
    for dirpath, _, _ in os.walk(path):
        if dirpath.endswith(os.path.join("system", "incremental")) or dirpath.endswith(
            os.path.join("framework", "pevents")
        ):
            return True
    return False


def verdicts_only_hint(source: str) -> str:
    """What to say of a folder holding SageMaker's ProfilerReport verdicts and nothing to
    replay: where they are, and the command that shows them."""
    reports = report_dirs(source)
    if not reports:
        return ""
    return (
        f"; it holds SageMaker's own ProfilerReport verdicts ({reports[0]}): "
        f"trainprof compare --sagemaker {source} shows them"
    )


def report_dirs(source: str) -> list[str]:
    """The `profiler-reports` folders under `source` (ProfilerReport's per-rule verdict
    JSONs, `ProfilerReport/profiler-output/profiler-reports/*.json`), or `source` itself
    when it is one; sorted."""
    if not os.path.isdir(source):
        return []
    found = []
    for dirpath, _, names in os.walk(source):
        if os.path.basename(dirpath) == REPORTS_DIR and any(n.endswith(".json") for n in names):
            found.append(dirpath)
    return sorted(found)


def find_profiler_output(source: str) -> ProfilerOutput:
    """Locate the system and framework files under `source` (a profiler-output directory
    or any directory above one). Raises SourceError if there is nothing, or two jobs."""
    if not os.path.isdir(source):
        raise SourceError(f"{source}: not a directory")
    roots = set()
    for dirpath, _, _ in os.walk(source):
        for marker in (os.path.join("system", "incremental"), os.path.join("framework", "pevents")):
            if dirpath.endswith(os.sep + marker) or dirpath == marker:
                roots.add(dirpath[: -len(marker)].rstrip(os.sep) or ".")
    if not roots:
        raise SourceError(
            f"{source}: no SageMaker profiler output here (looked for "
            "system/incremental and framework/pevents)" + verdicts_only_hint(source)
        )
    if len(roots) > 1:
        raise SourceError(
            f"{source}: holds the profiler output of several jobs; replay one "
            "of: " + ", ".join(sorted(roots))
        )
    root = roots.pop()
    system, traces, ignored = [], [], []
    for dirpath, _, names in os.walk(os.path.join(root, "system", "incremental")):
        for name in names:
            match = SYSTEM_FILE.match(name)
            if match:
                system.append((int(match.group(1)), match.group(2), os.path.join(dirpath, name)))
            else:
                ignored.append(os.path.join(dirpath, name))
    for dirpath, _, names in os.walk(os.path.join(root, "framework", "pevents")):
        for name in names:
            match = TRACE_FILE.match(name)
            if match:
                traces.append(
                    (
                        int(match.group(1)),
                        match.group(3),
                        int(match.group(2)),
                        os.path.join(dirpath, name),
                    )
                )
            elif name.endswith("_pythontimeline.json"):
                ignored.append(os.path.join(dirpath, name))
    system.sort(key=lambda f: (f[0], f[1], f[2]))
    traces.sort()
    return ProfilerOutput(root, system, traces, sorted(ignored))


def _read_text(path: str, damage: Damage) -> tuple[str, str] | None:
    """(text, digest) of a file, or None when it cannot be read (reported)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_SYSTEM_FILE_BYTES:
                damage.skip(
                    "files larger than a minute of SageMaker's system metrics",
                    f"{path} ({size:,} bytes; at most {MAX_SYSTEM_FILE_BYTES:,})",
                )
                return None
            data = f.read()
    except OSError as e:
        damage.skip("files unreadable", f"{path} ({e.strerror or e})")
        return None
    try:
        return data.decode("utf-8"), hashlib.sha256(data).hexdigest()
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        damage.skip("files not text", f"{path} (from line {line})")
        return None


def _events(path: str, text: str, damage: Damage) -> tuple[list[dict], list[int] | None]:
    """Every readable line's event, and the line numbers (None: event i is line i + 1); a
    damaged line is skipped and reported. An intact file is parsed in one call (the common
    case, and most of replay's reading time); line by line only when that fails."""
    try:
        # Lines that are not objects fail on their first field, reported then.
        return json.loads("[" + text.rstrip("\n").replace("\n", ",") + "]"), None
    except (json.JSONDecodeError, RecursionError):
        pass
    out, numbers = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        event = json_object(line, f"{path}:{number}", damage)
        if event is not None:
            out.append(event)
            numbers.append(number)
    return out, numbers


class _SnapshotBuilder:
    """Gathers one node's events into HostSamples, one per sampling instant."""

    def __init__(self):
        self.samples = CompactSamples()
        self._start: float | None = None
        self._cpu: dict[int, float] = {}
        self._iowait: dict[int, float] = {}
        self._util: dict[int, float] = {}
        self._mem: dict[int, float] = {}
        self._memory: float | None = None
        self._by_kind = {
            "cpu": self._cpu,
            "iowait": self._iowait,
            "util": self._util,
            "mem": self._mem,
        }

    def add(self, ts: float, kind: str, index: int, value: float) -> None:
        if self._start is not None and abs(ts - self._start) > SNAPSHOT_SPREAD:
            self.flush()
        if self._start is None:
            self._start = ts
        if kind == "memory":
            self._memory = value
        else:
            self._by_kind[kind][index] = value

    def flush(self) -> None:
        if self._start is None:
            return
        gpus = sorted(self._util.keys() | self._mem.keys())
        self.samples.append_values(  # the HostSample these make, packed
            self._start,
            [self._cpu[i] for i in sorted(self._cpu)],
            [self._iowait[i] for i in sorted(self._iowait)],
            self._memory,
            gpus,
            list(map(self._util.get, gpus)),
            list(map(self._mem.get, gpus)),
        )
        self._start, self._memory = None, None
        self._cpu, self._iowait, self._util, self._mem = {}, {}, {}, {}
        self._by_kind = {
            "cpu": self._cpu,
            "iowait": self._iowait,
            "util": self._util,
            "mem": self._mem,
        }


def read_system(found: ProfilerOutput, damage: Damage | None = None) -> SystemSamples:
    """Every node's samples in time order, values as ratios (SageMaker wrote percent).
    Damaged lines are skipped and counted in `damage`; out-of-range values clamped."""
    damage = damage if damage is not None else Damage()
    builders: dict[str, _SnapshotBuilder] = {}
    out = SystemSamples({})
    seen: dict[str, str] = {}
    classified: dict[tuple, tuple[str | None, int]] = {}
    for _, file_node, path in found.system_files:
        read = _read_text(path, damage)
        if read is None:
            continue
        text, digest = read
        if digest in seen:
            damage.skip("files identical to another", f"{path} (= {seen[digest]})")
            continue
        seen[digest] = path
        parsed, numbers = _events(path, text, damage)
        out.lines += len(parsed)
        events: list[tuple[str, float, str, int, float]] = []
        append = events.append
        for i, e in enumerate(parsed):
            try:
                ts, value = float(e["Timestamp"]), float(e["Value"]) / 100
                key = (e.get("Type"), e.get("Dimension", ""), e["Name"])
                node = e.get("NodeId") or file_node
                kind, index = classified[key]
            except KeyError:
                if "Timestamp" not in e or "Value" not in e or "Name" not in e:
                    damage.skip("without Name, Value and Timestamp", _where(path, i, numbers))
                    continue
                kind, index = classified[key] = _classify(key[0], str(key[1]), str(key[2]))
            except (TypeError, ValueError, OverflowError):
                damage.skip("without Name, Value and Timestamp", _where(path, i, numbers))
                continue
            if kind is None:
                (out.unused if index == -1 else out.unknown)[f"{key[1] or key[2]}"] += 1
                continue
            if not EARLIEST <= ts <= LATEST:  # also false for NaN
                damage.skip("with a timestamp outside 2000..2100", _where(path, i, numbers))
                continue
            if not 0.0 <= value <= 1.0:
                clamped = ratio(value, _where(path, i, numbers), damage, "values")
                if clamped is None:
                    continue
                value = clamped
            append((node if type(node) is str else str(node), ts, kind, index, value))
        _gather(events, builders)
    for node, builder in builders.items():
        builder.flush()
        out.by_node[node] = builder.samples.in_time_order()
    return out


def _gather(events: list[tuple[str, float, str, int, float]], builders: dict) -> None:
    """One file's events into each node's samples (`_SnapshotBuilder.add`, inlined)."""
    # Lines of one sample come in varying order; sort each file by time.
    events.sort(key=operator.itemgetter(0, 1))
    builder, current = None, None
    # Events of one node and time go to one sample: the sample's start is decided once.
    for (node, ts), same in itertools.groupby(events, key=operator.itemgetter(0, 1)):
        if builder is None or node != current:
            builder = builders.get(node) or builders.setdefault(node, _SnapshotBuilder())
            current = node
        start = builder._start
        if start is None:
            builder._start = ts
        elif ts - start > SNAPSHOT_SPREAD or start - ts > SNAPSHOT_SPREAD:
            builder.flush()
            builder._start = ts
        by_kind = builder._by_kind
        for _, _, kind, index, value in same:
            if kind == "memory":
                builder._memory = value
            else:
                by_kind[kind][index] = value


def _where(path: str, i: int, numbers: list[int] | None) -> str:
    return f"{path}:{numbers[i] if numbers is not None else i + 1}"


def _classify(kind, dimension: str, name: str) -> tuple[str | None, int]:
    """(sample field, core or GPU index); (None, -1) for known-but-unused lines."""
    if dimension in ("CPUUtilization", "I/OWaitPercentage"):
        match = _CORE.match(name)
        if match:
            return ("cpu" if dimension == "CPUUtilization" else "iowait"), int(match.group(1))
    elif dimension in ("GPUUtilization", "GPUMemoryUtilization"):
        match = _GPU.match(name)
        if match:
            return ("util" if dimension == "GPUUtilization" else "mem"), int(match.group(1))
    elif name == "MemoryUsedPercent":
        return "memory", 0
    elif kind in _UNUSED_TYPES or dimension in ("Algorithm", "Platform"):
        return None, -1
    return None, 0


def read_steps(found: ProfilerOutput, damage: Damage | None = None) -> list[Step]:
    """Every step of every rank, from the python timeline traces, in start order. A trace
    that cannot be read, or a step event that makes no sense, is skipped and counted."""
    damage = damage if damage is not None else Damage()
    steps: list[Step] = []
    for _, node, rank, path in found.trace_files:
        try:
            events = _trace(path)
        except SourceError as error:
            damage.skip("files not readable as traces", str(error))
            continue
        base = 0
        for e in events:
            given = e.get("args")
            args: dict = given if isinstance(given, dict) else {}
            if e.get("ph") == "M" and "start_time_since_epoch_in_micros" in args:
                try:
                    base = int(args["start_time_since_epoch_in_micros"])
                except (TypeError, ValueError):
                    damage.skip("steps in a trace without a start time", path)
                break
        for e in events:
            name = str(e.get("name", ""))
            if e.get("ph") != "X" or "Step:ModeKeys" not in name:
                continue
            try:
                start = (base + float(e["ts"])) / 1e6
                end = start + float(e.get("dur", 0)) / 1e6
                mode = canonical_mode(name)
            except (KeyError, TypeError, ValueError, OverflowError):
                damage.skip("step events without numeric ts/dur or a known mode", path)
                continue
            if not (timestamp_ok(start) and timestamp_ok(end) and end >= start):
                damage.skip("step events with times outside 2000..2100", path)
                continue
            steps.append(Step(node, rank, mode, start, end))
    steps.sort(key=lambda s: (s.start, s.node, s.rank))
    return steps


def _trace(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as stream:
            size = os.fstat(stream.fileno()).st_size
            text = stream.read() if size <= MAX_TRACE_FILE_BYTES else ""
    except OSError as e:
        raise SourceError(f"{path}: cannot read: {e.strerror or e}") from None
    except (UnicodeDecodeError, ValueError):
        raise SourceError(f"{path}: not a text file") from None
    if size > MAX_TRACE_FILE_BYTES:
        raise SourceError(
            f"{path}: {size:,} bytes, larger than smdebug writes a trace "
            f"(at most {MAX_TRACE_FILE_BYTES:,}); skipped unread"
        )
    try:
        data = json.loads(text)
    except RecursionError:
        raise SourceError(f"{path}: not a Chrome trace (nested too deeply)") from None
    except json.JSONDecodeError as first:
        # A trace still being written lacks its closing bracket.
        try:
            data = json.loads(text.rstrip().rstrip(",") + "]")
        except (json.JSONDecodeError, RecursionError):
            line = text.count("\n", 0, first.pos) + 1
            raise SourceError(f"{path}:{line}: not a Chrome trace: {first.msg}") from None
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    if not isinstance(data, list):
        raise SourceError(f"{path}: not a Chrome trace (expected a list of events)")
    return [e for e in data if isinstance(e, dict)]

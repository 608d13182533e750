"""A recorded job's timeline: SageMaker profiler output or a trainprof recording, read,
checked, and trimmed to the span the job ran."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from trainprof.contract.names import JOB_LABEL
from trainprof.contract.sampling import HostSample
from trainprof.replay import recorded, sagemaker
from trainprof.replay.compact import CompactSamples
from trainprof.replay.damage import MAX_GAP, Damage, main_span
from trainprof.replay.result import ReplayError
from trainprof.replay.timeline import PhaseTotals, Step, Timeline

FORMATS = ("auto", "sagemaker", "trainprof")
# SageMaker's allowed system_monitor_interval_millis values, in seconds.
SAGEMAKER_INTERVALS = (0.1, 0.2, 0.5, 1.0, 5.0, 60.0)
T = TypeVar("T")


def detect_format(source: str) -> str:
    if os.path.isfile(source):
        return "trainprof"
    if sagemaker.looks_like_sagemaker(source):
        return "sagemaker"
    if os.path.isdir(source) and any(
        n.endswith((".jsonl", ".jsonl.gz")) for n in os.listdir(source)
    ):
        return "trainprof"
    raise ReplayError(
        f"{source}: neither SageMaker profiler output (system/incremental, "
        "framework/pevents) nor a trainprof recording (.jsonl)"
        + sagemaker.verdicts_only_hint(source)
    )


def load_timeline(source: str, fmt: str, training_job: str | None) -> tuple[Timeline, list[str]]:
    """The timeline of a source and notes about what was found, skipped or corrected."""
    if not os.path.exists(source):
        raise ReplayError(f"{source}: no such file or directory")
    fmt = detect_format(source) if fmt == "auto" else fmt
    damage = Damage()
    if fmt == "sagemaker":
        timeline, notes = _sagemaker_timeline(source, training_job, damage)
    else:
        timeline, notes = _recording_timeline(source, training_job, damage)
    _keep_main_span(timeline, damage)
    return timeline, notes + damage.notes()


def _keep_main_span(timeline: Timeline, damage: Damage) -> None:
    """Drop what lies far from the job (a stray timestamp, a file of another year): the
    work replay does grows with the span, which the data must bound."""
    times = [t for samples in timeline.hosts.values() for t in _times(samples)]
    times += [s.start for s in timeline.steps] + [s.end for s in timeline.steps]
    times += [p.t for p in timeline.phases]
    span = main_span(times)
    if span is None:
        return
    first, last = span
    far = 0
    for node, samples in timeline.hosts.items():
        kept: Sequence[HostSample]
        if isinstance(samples, CompactSamples):
            kept = samples.select(first, last)
        else:
            kept = [s for s in samples if first <= s.timestamp <= last]
        far += len(samples) - len(kept)
        timeline.hosts[node] = kept
    kept_steps = [s for s in timeline.steps if first <= s.start and s.end <= last]
    far += len(timeline.steps) - len(kept_steps)
    timeline.steps = kept_steps
    kept_phases = [p for p in timeline.phases if first <= p.t <= last]
    far += len(timeline.phases) - len(kept_phases)
    timeline.phases = kept_phases
    for key, start in list(timeline.rank_starts.items()):
        if not first - MAX_GAP <= start <= last:
            del timeline.rank_starts[key]
            far += 1
    for key, times in list(timeline.rank_restarts.items()):
        kept_times = [t for t in times if first - MAX_GAP <= t <= last]
        far += len(times) - len(kept_times)
        timeline.rank_restarts[key] = kept_times
    for key, end in list(timeline.rank_ends.items()):
        if not first <= end <= last + MAX_GAP:
            del timeline.rank_ends[key]
            far += 1
    if far:
        damage.skip(
            f"samples or steps more than {MAX_GAP / 3600:g} h away from the job "
            f"(which ran {_utc(first)} .. {_utc(last)} UTC)",
            "outside that span",
            far,
        )


def _utc(t: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def _sagemaker_timeline(
    source: str, training_job: str | None, damage: Damage
) -> tuple[Timeline, list[str]]:
    try:
        found = sagemaker.find_profiler_output(source)
    except sagemaker.SourceError as e:
        raise ReplayError(str(e)) from None
    system = sagemaker.read_system(found, damage)
    notes = [
        f"found SageMaker profiler output at {found.root}: {len(found.system_files)} system "
        f"file(s), {len(found.trace_files)} framework trace(s)"
    ]
    if found.ignored:
        notes.append(
            f"ignored {len(found.ignored)} file(s) not named like SageMaker's: "
            + ", ".join(os.path.basename(p) for p in found.ignored[:5])
        )
    if system.unknown:
        notes.append(
            "ignored unknown dimensions: "
            + ", ".join(f"{k} ({n} lines)" for k, n in sorted(system.unknown.items()))
        )
    steps = sagemaker.read_steps(found, damage)
    if not any(system.by_node.values()):
        if not steps:
            raise ReplayError(
                f"{found.root}: no system metrics (system/incremental/"
                "*.algo-N.json holds no CPU, GPU or memory lines) and no steps"
                + "".join(f"; {n}" for n in damage.notes())
            )
        notes.append(
            "no system metrics (system/incremental): only StepOutlier and "
            "MaxInitializationTime had input"
        )
    ranks = sorted({(node, rank) for _, node, rank, _ in found.trace_files})
    if not ranks:
        notes.append(
            "no framework traces (framework/pevents): MaxInitializationTime and "
            "StepOutlier had no input"
        )
    job = training_job or _job_name(found.root)
    return Timeline(system.by_node, job, _sampling_interval(system.by_node), steps, ranks), notes


def _job_name(root: str) -> str:
    """SageMaker's profiler-output sits under <job>/... ; name the job after the folder."""
    parts = [p for p in Path(root).resolve().parts if p not in ("/", "profiler-output")]
    if not parts:
        return "sagemaker-job"
    # <base-job-name>/-<timestamp>/ is a common layout: the job is both parts together.
    if parts[-1].startswith("-") and len(parts) > 1:
        return parts[-2] + parts[-1]
    return parts[-1]


def _times(samples) -> Sequence[float]:
    return samples.times if isinstance(samples, CompactSamples) else [s.timestamp for s in samples]


def _sampling_interval(by_node) -> float:
    gaps = []
    for samples in by_node.values():
        times = _times(samples)
        gaps += [b - a for a, b in zip(times, times[1:])]
    if not gaps:
        return 0.5
    median = statistics.median(gaps)
    return min(SAGEMAKER_INTERVALS, key=lambda i: abs(i - median))


def _add_new(seen: set[T], found: T | None) -> int:
    """Add `found` (None: nothing) to `seen`; 1 where it was there already, a duplicate.

    >>> seen = {1}
    >>> _add_new(seen, 2), _add_new(seen, 2), _add_new(seen, None), sorted(seen)
    (0, 1, 0, [1, 2])
    """
    if found is None:
        return 0
    again = found in seen
    seen.add(found)
    return int(again)


def _recording_timeline(
    source: str, training_job: str | None, damage: Damage
) -> tuple[Timeline, list[str]]:
    paths = (
        [source]
        if os.path.isfile(source)
        else sorted(
            os.path.join(source, n)
            for n in os.listdir(source)
            if n.endswith((".jsonl", ".jsonl.gz"))
        )
    )
    hosts: dict[str, dict[float, HostSample]] = {}
    steps: set[Step] = set()
    phases: set[PhaseTotals] = set()
    starts: dict[tuple[str, int], set[float]] = {}
    ends: dict[tuple[str, int], float] = {}
    # The job's name: what the training processes say (`start(training_job=...)`), else
    # what a meta record says.
    jobs: dict[str, str] = {}
    interval, job, skipped, duplicates = None, None, 0, 0
    for path in paths:
        for number, record in recorded.records(path, damage):
            where = f"{path}:{number}"
            kind = record.get("kind")
            if kind == "meta":
                value = record.get("datapoint_interval")
                if isinstance(value, (int, float)) and 0 < value <= 3600:
                    interval = interval or float(value)
                name = record.get(JOB_LABEL) or record.get("job")
                job = job or (str(name) if name else None)
            elif kind == "host":
                sample = recorded.host_sample(record, where, damage)
                if sample is not None:
                    node = hosts.setdefault(str(record.get("node", "node")), {})
                    duplicates += sample.timestamp in node
                    node[sample.timestamp] = sample
            elif kind == "step":
                duplicates += _add_new(steps, recorded.step(record, where, damage))
            elif kind == "process":
                found = recorded.process_start(record, where, damage)
                if found is not None:
                    starts.setdefault(found[0], set()).add(found[1])
                named = recorded.training_job(record)
                if named is not None:
                    jobs.setdefault(named, path)
            elif kind == "phases":
                duplicates += _add_new(phases, recorded.phase_totals(record, where, damage))
            elif kind == "end":
                ended = recorded.process_end(record, where, damage)
                if ended is not None:
                    ends[ended[0]] = max(ended[1], ends.get(ended[0], ended[1]))
            else:
                skipped += 1
    notes = [f"found {len(paths)} recording file(s) at {source}"]
    if skipped:
        notes.append(f"skipped {skipped} record(s) of kinds replay does not read")
    if duplicates:
        notes.append(
            f"skipped {duplicates} duplicated record(s) (a sample or step recorded twice, "
            "as in a copied file)"
        )
    by_node: dict[str, Sequence[HostSample]] = {
        n: sorted(s.values(), key=lambda x: x.timestamp) for n, s in hosts.items()
    }
    if not any(by_node.values()) and not steps and not starts:
        raise ReplayError(
            f"{source}: the recording holds no host samples and no steps"
            + "".join(f"; {n}" for n in damage.notes())
        )
    interval = interval or _sampling_interval(by_node)
    ranks = sorted(
        set(starts) | {(s.node, s.rank) for s in steps} | {(p.node, p.rank) for p in phases}
    )
    ordered = sorted(steps, key=lambda s: (s.start, s.node, s.rank))
    if len(jobs) > 1 and not training_job:
        notes.append(
            f"the recordings name {len(jobs)} training jobs ("
            + ", ".join(f"{n!r} in {os.path.basename(p)}" for n, p in jobs.items())
            + f"); replayed as {next(iter(jobs))!r} (--job names it)"
        )
    name = training_job or next(iter(jobs), None) or job or "recorded-job"
    firsts = {key: min(times) for key, times in starts.items()}
    timeline = Timeline(by_node, name, interval, ordered, ranks, firsts)
    timeline.rank_restarts = {
        key: sorted(times)[1:] for key, times in starts.items() if len(times) > 1
    }
    if timeline.rank_restarts:
        notes.append(
            "replayed as restarted processes (their counters start again, as a new run's): "
            + ", ".join(
                f"{node} rank {rank} at {', '.join(_utc(t) for t in times)} UTC"
                for (node, rank), times in sorted(timeline.rank_restarts.items())
            )
        )
    timeline.phases = sorted(phases, key=lambda p: (p.t, p.node, p.rank))
    # A rank that started again after its last end record (a restart, appending) runs on.
    timeline.rank_ends = {k: t for k, t in ends.items() if t >= max(starts.get(k, {t}))}
    return timeline, notes

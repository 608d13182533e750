"""`trainprof replay`: which rules would have fired on a recorded job, and when.

The recorded samples become the series an exporter would have served, scraped every
`scrape_interval`; the compiled rules (the same PromQL `trainprof rules compile` writes) are
evaluated over them by promtool's real rule engine, `for:` included.

    >>> result = replay("profiler-output/", "rules.yaml", scrape_interval=15)   # doctest: +SKIP
    >>> result.rules["LowGPUUtilization"].fired                                 # doctest: +SKIP
    True
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from trainprof import recording
from trainprof.names import HEALTH_RULE
from trainprof.promtool import run_rules
from trainprof.replay import sagemaker
from trainprof.replay.timeline import Step, Timeline, scrape, shift_timestamps
from trainprof.rules.compiler import Compiled, compile_rules
from trainprof.rules.config import RulesConfig
from trainprof.rules.files import read_config
from trainprof.sampling import BottleneckGrid
from trainprof.training_state import canonical_mode

FORMATS = ("auto", "sagemaker", "trainprof")
# SageMaker's allowed system_monitor_interval_millis values, in seconds.
SAGEMAKER_INTERVALS = (0.1, 0.2, 0.5, 1.0, 5.0, 60.0)


class ReplayError(ValueError):
    """Input replay cannot use: the message names the file (and line) and what is wrong."""


@dataclasses.dataclass
class FiredAlert:
    labels: dict[str, str]
    fired_at: float


@dataclasses.dataclass
class Verdict:
    alerts: list[FiredAlert] = dataclasses.field(default_factory=list)

    @property
    def fired(self) -> bool:
        return bool(self.alerts)

    @property
    def first_fired_at(self) -> float | None:
        return min((a.fired_at for a in self.alerts), default=None)


@dataclasses.dataclass(frozen=True)
class Query:
    """PromQL to evaluate over the replayed series: at the end only, or `over_time`."""

    expr: str
    over_time: bool = False


# (resolved configuration, training_job, seconds replayed) -> {name: Query}
# Given the compiled rules, the job's name and the seconds replayed: the queries to evaluate.
QueryBuilder = Callable[[Compiled, str, float], Mapping[str, Query]]
Samples = list[tuple[dict[str, str], float]]


@dataclasses.dataclass
class ReplayResult:
    rules: dict[str, Verdict]
    health: list[FiredAlert]
    source: str
    nodes: int
    gpus: int
    samples: int
    steps: int
    start: float
    end: float
    datapoint_interval: float
    scrape_interval: float
    evaluation_interval: float
    notes: list[str]
    compiled: Compiled  # the rules as replayed
    training_job: str = ""
    # name -> {Unix time: samples} of the queries asked for (replay(..., queries=)).
    queries: dict[str, dict[float, Samples]] = dataclasses.field(default_factory=dict)

    @property
    def config(self) -> RulesConfig:
        return self.compiled.config

    def as_json(self) -> dict:
        """Exactly the documented contract:
        {"rules": {"<Rule>": {"fired", "first_fired_at", "alerts": [{"labels", "fired_at"}]}}}"""
        return {
            "rules": {
                name: {
                    "fired": v.fired,
                    "first_fired_at": _number(v.first_fired_at),
                    "alerts": [
                        {"labels": a.labels, "fired_at": _number(a.fired_at)} for a in v.alerts
                    ],
                }
                for name, v in self.rules.items()
            }
        }


def _number(value: float | None):
    if value is None:
        return None
    return int(value) if float(value).is_integer() else round(value, 3)


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
    )


def load_timeline(source: str, fmt: str, training_job: str | None) -> tuple[Timeline, list[str]]:
    """The timeline of a source and notes about what was skipped."""
    if not os.path.exists(source):
        raise ReplayError(f"{source}: no such file or directory")
    fmt = detect_format(source) if fmt == "auto" else fmt
    if fmt == "sagemaker":
        return _sagemaker_timeline(source, training_job)
    return _recording_timeline(source, training_job)


def _sagemaker_timeline(source: str, training_job: str | None) -> tuple[Timeline, list[str]]:
    try:
        found = sagemaker.find_profiler_output(source)
        system = sagemaker.read_system(found)
    except sagemaker.SourceError as e:
        raise ReplayError(str(e)) from None
    notes = []
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
    try:
        steps = sagemaker.read_steps(found)
    except sagemaker.SourceError as e:
        raise ReplayError(str(e)) from None
    if not any(system.by_node.values()):
        if not steps:
            raise ReplayError(
                f"{found.root}: no system metrics (system/incremental/"
                "*.algo-N.json holds no CPU, GPU or memory lines) and no steps"
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


def _sampling_interval(by_node) -> float:
    gaps = [
        b.timestamp - a.timestamp
        for samples in by_node.values()
        for a, b in zip(samples, samples[1:])
    ]
    if not gaps:
        return 0.5
    median = statistics.median(gaps)
    return min(SAGEMAKER_INTERVALS, key=lambda i: abs(i - median))


def _recording_timeline(source: str, training_job: str | None) -> tuple[Timeline, list[str]]:
    paths = (
        [source]
        if os.path.isfile(source)
        else sorted(
            os.path.join(source, n)
            for n in os.listdir(source)
            if n.endswith((".jsonl", ".jsonl.gz"))
        )
    )
    hosts: dict[str, list] = {}
    steps: list[Step] = []
    starts: dict[tuple[str, int], float] = {}
    interval, notes, skipped = None, [], 0
    for path in paths:
        try:
            for number, record in recording.read(path):
                kind = record.get("kind")
                if kind == "meta":
                    interval = interval or record.get("datapoint_interval")
                elif kind == "host":
                    try:
                        sample = recording.host_sample(record)
                    except (KeyError, TypeError, ValueError) as e:
                        raise ReplayError(f"{path}:{number}: malformed host record: {e}") from None
                    hosts.setdefault(str(record.get("node", "node")), []).append(sample)
                elif kind in ("step", "process"):
                    try:
                        key = (str(record["node"]), int(record["rank"]))
                        if kind == "process":
                            starts[key] = float(record["start"])
                        else:
                            steps.append(
                                Step(
                                    key[0],
                                    key[1],
                                    canonical_mode(record["mode"]),
                                    float(record["start"]),
                                    float(record["end"]),
                                )
                            )
                    except (KeyError, TypeError, ValueError) as e:
                        raise ReplayError(
                            f"{path}:{number}: malformed {kind} record: {e}"
                        ) from None
                else:
                    skipped += 1
        except recording.RecordingError as e:
            raise ReplayError(str(e)) from None
    if skipped:
        notes.append(f"skipped {skipped} record(s) of kinds replay does not read")
    if not any(hosts.values()) and not steps and not starts:
        raise ReplayError(f"{source}: the recording holds no host samples and no steps")
    for samples in hosts.values():
        samples.sort(key=lambda s: s.timestamp)
    interval = float(interval) if interval else _sampling_interval(hosts)
    ranks = sorted(set(starts) | {(s.node, s.rank) for s in steps})
    return Timeline(hosts, training_job or "recorded-job", interval, steps, ranks, starts), notes


def replay(
    source: str,
    rules: str | RulesConfig | None,
    scrape_interval: float = 15.0,
    datapoint_interval: float | None = None,
    fmt: str = "auto",
    training_job: str | None = None,
    promtool: str | None = None,
    progress: bool = False,
    workdir: str | None = None,
    queries: QueryBuilder | None = None,
    query_points: int = 200,
) -> ReplayResult:
    """Replay `source` through the compiled rules. `queries`, given the compiled rules, the
    job's name and the seconds replayed, names extra PromQL to evaluate
    over the same series and rules: at the end, or at about `query_points` times."""
    timeline, notes = load_timeline(source, fmt, training_job)
    if datapoint_interval is not None:
        timeline.datapoint_interval = datapoint_interval
    config = (
        rules
        if isinstance(rules, RulesConfig)
        else read_config(
            rules,
            scrape_interval=scrape_interval,
            datapoint_interval=f"{timeline.datapoint_interval}s",
        )
    )
    compiled = compile_rules(config)
    notes += list(compiled.warnings)

    # Replay stands for exporters started with --rules.config: they count every threshold
    # the configuration needs.
    needed = compiled.inputs
    grid = BottleneckGrid.default().including(
        cpu=needed["cpu_bottleneck"], io=needed["io_bottleneck"]
    )
    scraped = scrape(
        timeline, config.scrape_interval, grid, progress, stddevs=needed["step_outlier_stddevs"]
    )
    shift_timestamps(
        scraped.series,
        scraped.start,
        (
            "trainprof_training_start_timestamp_seconds",
            "trainprof_training_first_step_timestamp_seconds",
            "trainprof_training_last_step_timestamp_seconds",
        ),
    )
    evaluation = min(_seconds(g["interval"]) for g in compiled.groups)
    asked = {}
    if queries is not None:
        times = _query_times(scraped.end, config.scrape_interval, query_points)
        asked = {
            name: (q.expr, times if q.over_time else [scraped.end])
            for name, q in queries(compiled, timeline.training_job, scraped.end).items()
        }
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        run = run_rules(
            compiled.groups,
            scraped.series,
            config.scrape_interval,
            evaluation,
            scraped.end,
            Path(tmp),
            promtool,
            queries=asked,
        )
    firing = run.firing

    verdicts = {i.spec.name: Verdict() for i in config.rules}
    health: list[FiredAlert] = []
    for labels, fired_at in _rising_edges(firing, evaluation, scraped.end):
        labels = {k: v for k, v in labels.items() if k not in ("__name__", "alertstate")}
        alert = FiredAlert(labels, scraped.start + fired_at)
        rule = labels.get("rule")
        if rule == HEALTH_RULE:
            health.append(alert)
        elif rule in verdicts:
            verdicts[rule].alerts.append(alert)
    return ReplayResult(
        rules=verdicts,
        health=health,
        source=source,
        nodes=len(timeline.hosts),
        gpus=sum(
            len({g.index for s in samples for g in s.gpus}) for samples in timeline.hosts.values()
        ),
        samples=sum(len(s) for s in timeline.hosts.values()),
        steps=len(timeline.steps),
        start=scraped.start,
        end=scraped.start + scraped.end,
        datapoint_interval=timeline.datapoint_interval,
        scrape_interval=config.scrape_interval,
        evaluation_interval=evaluation,
        notes=notes,
        training_job=timeline.training_job,
        compiled=compiled,
        queries={
            name: {scraped.start + t: samples for t, samples in by_time.items()}
            for name, by_time in run.queries.items()
        },
    )


def query_step(seconds: float, scrape_interval: float, points: int) -> float:
    """The time between two of about `points` query evaluations over `seconds`: a whole
    number of scrape intervals."""
    return scrape_interval * max(1, math.ceil(seconds / max(points, 1) / scrape_interval))


def _query_times(end: float, scrape_interval: float, points: int) -> list[float]:
    """About `points` evaluation times up to `end`, whole scrape intervals apart."""
    step = query_step(end, scrape_interval, points)
    times = [k * step for k in range(1, int(end // step) + 1)]
    return times if times and times[-1] == end else times + [end]


def _seconds(duration: str) -> float:
    from trainprof.durations import parse_duration

    return parse_duration(duration)


def _rising_edges(firing: dict[float, list[dict[str, str]]], step: float, end: float):
    """(labels, time) each time an alert starts firing, in time order."""
    previous: set[tuple] = set()
    t = step
    while t <= end + 1e-9:
        now = {tuple(sorted(labels.items())) for labels in firing.get(t, [])}
        for key in sorted(now - previous):
            yield dict(key), t
        previous = now
        t = round(t + step, 6)
    return

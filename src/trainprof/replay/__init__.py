"""`trainprof replay`: which rules would have fired on a recorded job, and when.

The recorded samples become the series an exporter would have served, scraped every
`scrape_interval`; the compiled rules (the same PromQL `trainprof rules compile` writes) are
evaluated over them by promtool's real rule engine, `for:` included.

    >>> job = "../shared/real-sagemaker/trimcrae-8xtt-redock"  # its profiler-output/ is below
    >>> result = replay(job, None, scrape_interval=15)  # None: the default rules, compiled
    >>> result.rules["LowGPUUtilization"].fired, result.rules["CPUBottleneck"].fired
    (True, False)
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from trainprof.contract.names import HEALTH_RULE
from trainprof.contract.sampling import BottleneckGrid, HostSample
from trainprof.engines.promtool import run_rules
from trainprof.replay import chunks, recorded, sagemaker
from trainprof.replay.cadence import SlowAlerts
from trainprof.replay.compact import CompactSamples
from trainprof.replay.damage import MAX_GAP, Damage, main_span
from trainprof.replay.exporters import Exporters, check_sources, held_gpu_readings
from trainprof.replay.timeline import PhaseTotals, Step, Timeline, instants, scrape
from trainprof.rules.compiler import Compiled, compile_rules
from trainprof.rules.config import RulesConfig
from trainprof.rules.files import read_config
from trainprof.rules.status import NOT_APPLICABLE, RuleStatus, decide, status_queries
from trainprof.sources.options import parse_sources

FORMATS = ("auto", "sagemaker", "trainprof")
# SageMaker's allowed system_monitor_interval_millis values, in seconds.
SAGEMAKER_INTERVALS = (0.1, 0.2, 0.5, 1.0, 5.0, 60.0)
# Scrape instants replay will evaluate at most: 11.6 days at a 1 s scrape.
MAX_INSTANTS = 1_000_000
STATUS_POINTS = 30
ACTIVE = "alerts.active"  # the query of active alerts, for groups slower than the fastest


class ReplayError(ValueError):
    """Input replay cannot use: the message names the file (and line) and what is wrong."""


@dataclasses.dataclass
class FiredAlert:
    labels: dict[str, str]
    fired_at: float
    step: int | None = None  # the training step, for a tensor trial's saved steps


@dataclasses.dataclass
class Verdict:
    alerts: list[FiredAlert] = dataclasses.field(default_factory=list)
    # fired | quiet | no_data | not_applicable, with the datapoints and measure behind it.
    status: RuleStatus | None = None

    @property
    def fired(self) -> bool:
        return bool(self.alerts)

    @property
    def first_fired_at(self) -> float | None:
        return min((a.fired_at for a in self.alerts), default=None)

    @property
    def first_fired_step(self) -> int | None:
        return min((a.step for a in self.alerts if a.step is not None), default=None)


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
    # dcgm-exporter's collection period, when the rules read dcgm (None: every scrape).
    collect_interval: float | None = None
    # name -> {Unix time: samples} of the queries asked for (replay(..., queries=)).
    queries: dict[str, dict[float, Samples]] = dataclasses.field(default_factory=dict)
    # promtool runs the job was evaluated in (trainprof.replay.chunks), and when one, why.
    chunks: int = 1
    one_pass: str = ""
    # Seconds after t0 where each chunk's own part starts, and the warm-up before it.
    chunk_starts: tuple[float, ...] = (0.0,)
    warmup: float = 0.0

    @property
    def config(self) -> RulesConfig:
        return self.compiled.config

    def as_json(self) -> dict:
        """Exactly the documented contract: {"rules": {"<Rule>": {"fired", "status",
        "datapoints", "measured", "first_fired_at", "alerts": [{"labels", "fired_at"}]}}}"""
        return {
            "rules": {
                name: {
                    "fired": v.fired,
                    **(v.status.as_json() if v.status else {}),
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
    starts: dict[tuple[str, int], float] = {}
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
                name = record.get("training_job") or record.get("job")
                job = job or (str(name) if name else None)
            elif kind == "host":
                sample = recorded.host_sample(record, where, damage)
                if sample is not None:
                    node = hosts.setdefault(str(record.get("node", "node")), {})
                    duplicates += sample.timestamp in node
                    node[sample.timestamp] = sample
            elif kind == "step":
                step = recorded.step(record, where, damage)
                if step is not None:
                    duplicates += step in steps
                    steps.add(step)
            elif kind == "process":
                found = recorded.process_start(record, where, damage)
                if found is not None:
                    starts[found[0]] = found[1]
                named = recorded.training_job(record)
                if named is not None:
                    jobs.setdefault(named, path)
            elif kind == "phases":
                totals = recorded.phase_totals(record, where, damage)
                if totals is not None:
                    duplicates += totals in phases
                    phases.add(totals)
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
    timeline = Timeline(by_node, name, interval, ordered, ranks, starts)
    timeline.phases = sorted(phases, key=lambda p: (p.t, p.node, p.rank))
    return timeline, notes


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
    sources: tuple[str, ...] | None = None,
    collect_interval: float | None = None,
    chunk_instants: int = chunks.CHUNK_INSTANTS,
) -> ReplayResult:
    """Replay `source` through the compiled rules. `queries`, given the compiled rules, the
    job's name and the seconds replayed, names extra PromQL to evaluate
    over the same series and rules: at the end, or at about `query_points` times.

    `sources` (default: the configuration's `source`) names the exporters the rules read:
    for dcgm and node_exporter their series are synthesised from the timeline
    (trainprof.replay.exporters), dcgm-exporter collecting every `collect_interval`
    (default: every scrape), and the rules are compiled for them. `chunk_instants`: the
    scrape instants each promtool run answers for at most (trainprof.replay.chunks)."""
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
    _check_scrape_interval(timeline, config.scrape_interval)
    config, exporters = _with_sources(config, sources, collect_interval)
    if collect_interval is not None and "dcgm" not in config.source:
        # trainprof's exporter reading its GPUs from dcgm-exporter (--collector.gpu.dcgm-exporter)
        timeline.hosts = {
            node: held_gpu_readings(samples, collect_interval, timeline.start)
            for node, samples in timeline.hosts.items()
        }
    compiled = compile_rules(config)
    notes += list(compiled.warnings)

    # Replay stands for exporters started with --rules.config: they count every threshold
    # the configuration needs.
    needed = compiled.inputs
    grid = BottleneckGrid.default().including(
        cpu=needed["cpu_bottleneck"], io=needed["io_bottleneck"]
    )
    count = instants(timeline, config.scrape_interval)
    end = (count - 1) * config.scrape_interval
    evaluation = min(_seconds(g["interval"]) for g in compiled.groups)
    times = _query_times(end, config.scrape_interval, query_points)
    # A rule's extreme over the job, for people: a few dozen points suffice and each
    # point is one more query for promtool.
    status_times = _query_times(end, config.scrape_interval, STATUS_POINTS)
    asked = {
        name: (expr, status_times if over_time else [end])
        for name, (expr, over_time) in _status_queries(
            compiled, timeline.training_job, end, STATUS_POINTS
        ).items()
    }
    if queries is not None:
        asked.update(
            {
                name: (q.expr, times if q.over_time else [end])
                for name, q in queries(compiled, timeline.training_job, end).items()
            }
        )
    # Only with an adapter source: trainprof's own replay stays as it was.
    slow = SlowAlerts(compiled.groups if exporters else [], evaluation)
    if slow:
        asked[ACTIVE] = ("ALERTS", slow.times(end))
    # A long job goes through promtool in time chunks (trainprof.replay.chunks); a short
    # one, or one whose rules read back further than a chunk, in one pass.
    plan, need, one_pass = chunks.plan(
        compiled.groups, asked, count, config.scrape_interval, evaluation, chunk_instants
    )
    store = chunks.ChunkedStore(plan, count, need, spill_dir=workdir) if plan is not None else None
    scraped = scrape(
        timeline,
        config.scrape_interval,
        grid,
        progress,
        stddevs=needed["step_outlier_stddevs"],
        workdir=workdir,
        exporters=exporters,
        store=store,
    )
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        if store is not None:
            run = chunks.run_chunked(
                store,
                compiled.groups,
                config.scrape_interval,
                evaluation,
                Path(tmp),
                promtool,
                asked,
                ordered=exporters is not None,
            )
        else:
            run = run_rules(
                compiled.groups,
                scraped.series,
                config.scrape_interval,
                evaluation,
                scraped.end,
                Path(tmp),
                promtool,
                queries=asked,
                # trainprof.sources' recordings are read by the later groups: first, always.
                ordered=exporters is not None,
            )
    scraped.series.close()
    firing = run.firing
    if slow:
        # Alerts of groups slower than `evaluation` (the alert groups beside a 15 s
        # trainprof.sources group) as their own interval evaluates them.
        active = {t: [lb for lb, _ in got] for t, got in run.queries.pop(ACTIVE, {}).items()}
        slow_firing = slow.firing(active, scraped.end)
        firing = {
            t: [lb for lb in firing.get(t, []) if slow.rule_of(lb) is None] + slow_firing.get(t, [])
            for t in sorted(set(firing) | set(slow_firing))
        }
    answers = {
        name: _grouped(by_time)
        for name, by_time in run.queries.items()
        if name.startswith("status.")
    }

    verdicts = {i.spec.name: Verdict() for i in config.rules}
    source_names = "source " + ",".join(config.source)
    health: list[FiredAlert] = []
    for labels, fired_at in _rising_edges(firing, evaluation, scraped.end):
        labels = {k: v for k, v in labels.items() if k not in ("__name__", "alertstate")}
        alert = FiredAlert(labels, scraped.start + fired_at)
        rule = labels.get("rule")
        if rule == HEALTH_RULE:
            health.append(alert)
        elif rule in verdicts:
            verdicts[rule].alerts.append(alert)
    for name, verdict in verdicts.items():
        if compiled.config.rule(name) is None:
            # Left out by the compiler (LoadBalancing on dcgm: one value per scrape cannot
            # give a GPU's utilization distribution); its warning is among the notes.
            verdict.status = RuleStatus(
                NOT_APPLICABLE, None, None, f"not compiled for {source_names}"
            )
            continue
        verdict.status = decide(compiled, name, verdict.fired, answers)
        if verdict.status.reason:
            notes.append(
                f"{name}: {verdict.status.status.replace('_', ' ')}: {verdict.status.reason}"
            )
    return ReplayResult(
        rules=verdicts,
        health=health,
        source=source,
        nodes=len(timeline.hosts),
        gpus=sum(
            len(
                samples.gpu_indices()
                if isinstance(samples, CompactSamples)
                else {g.index for s in samples for g in s.gpus}
            )
            for samples in timeline.hosts.values()
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
        collect_interval=collect_interval,
        chunks=len(plan.windows) if plan is not None else 1,
        one_pass=one_pass,
        chunk_starts=tuple(w.own_lo * config.scrape_interval for w in plan.windows)
        if plan is not None
        else (0.0,),
        warmup=plan.overlap * config.scrape_interval if plan is not None else 0.0,
        queries={
            name: {scraped.start + t: samples for t, samples in by_time.items()}
            for name, by_time in run.queries.items()
        },
    )


def _with_sources(
    config: RulesConfig, sources: tuple[str, ...] | None, collect_interval: float | None
) -> tuple[RulesConfig, Exporters | None]:
    """The configuration compiled for `sources` (its own when None), and the exporters
    whose series replay synthesises for them (None: trainprof's exporter alone, as ever)."""
    try:
        if sources is not None:
            config = dataclasses.replace(config, source=parse_sources(",".join(sources)))
        check_sources(config.source, config.scrape_interval, collect_interval)
    except ValueError as e:
        raise ReplayError(str(e)) from None
    if config.source == ("trainprof",):
        return config, None
    options = dataclasses.replace(
        config.source_options, job_labels=config.job_labels, scrape_interval=config.scrape_interval
    )
    config = dataclasses.replace(config, source_options=options)
    return config, Exporters(config.source, options, collect_interval)


def _check_scrape_interval(timeline: Timeline, scrape_interval: float) -> None:
    """Refuse a scrape interval that would make replay's work unbounded by the data:
    faster than the samples (it adds nothing), or too many instants over the job."""
    floor = min(timeline.datapoint_interval, 1.0)
    if not math.isfinite(scrape_interval) or scrape_interval < floor - 1e-9:
        raise ReplayError(
            f"--scrape-interval {scrape_interval:g}s is shorter than the samples "
            f"({timeline.datapoint_interval:g}s apart): scraping faster adds nothing; use "
            f"{floor:g}s or more"
        )
    instants = (timeline.last - timeline.start) / scrape_interval
    if instants > MAX_INSTANTS:
        shortest = (timeline.last - timeline.start) / MAX_INSTANTS
        raise ReplayError(
            f"the job spans {(timeline.last - timeline.start) / 3600:.1f} h: a scrape every "
            f"{scrape_interval:g}s means {instants:,.0f} scrape instants (at most "
            f"{MAX_INSTANTS:,}); use --scrape-interval {math.ceil(shortest)}s or more"
        )


def _status_queries(
    compiled: Compiled, job: str, seconds: float, points: int
) -> dict[str, tuple[str, bool]]:
    from trainprof.report.queries import grafana_builtins

    interval = compiled.config.scrape_interval
    step = query_step(seconds, interval, points)
    return status_queries(compiled, job, None, grafana_builtins(seconds, step, interval))


def _grouped(by_time: dict[float, Samples]) -> list[tuple[dict[str, str], list]]:
    """{time: [(labels, value)]} -> [(labels, [(time, value)])]."""
    grouped: dict[tuple, list] = {}
    for t, samples in sorted(by_time.items()):
        for labels, value in samples:
            grouped.setdefault(tuple(sorted(labels.items())), []).append((t, value))
    return [(dict(k), points) for k, points in grouped.items()]


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
    from trainprof.contract.durations import parse_duration

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

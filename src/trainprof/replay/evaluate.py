"""`replay()`: a timeline scraped as an exporter would have served it and evaluated by
promtool's rule engine, `for:` included; a verdict per rule."""

from __future__ import annotations

import dataclasses
import math
import tempfile
from pathlib import Path

from trainprof.contract.names import HEALTH_RULE, JOB_LABEL
from trainprof.contract.sampling import BottleneckGrid
from trainprof.engines.promtool import run_rules
from trainprof.replay import chunks
from trainprof.replay.cadence import AlertStates
from trainprof.replay.compact import CompactSamples
from trainprof.replay.exporters import Exporters, check_sources, held_gpu_readings
from trainprof.replay.load import load_timeline
from trainprof.replay.result import (
    FiredAlert,
    QueryBuilder,
    ReplayError,
    ReplayResult,
    Samples,
    Verdict,
    reads_training,
)
from trainprof.replay.timeline import Timeline, instants, scrape
from trainprof.rules.compiler import Compiled, compile_rules
from trainprof.rules.config import RulesConfig
from trainprof.rules.files import read_config
from trainprof.rules.job_alerts import affected_selector, holds, units_found, without_holds
from trainprof.rules.promql import quote
from trainprof.rules.status import NOT_APPLICABLE, RuleStatus, decide, status_queries
from trainprof.sources.options import parse_sources

# Scrape instants replay will evaluate at most: 11.6 days at a 1 s scrape.
MAX_INSTANTS = 1_000_000
STATUS_POINTS = 30
AFFECTED = "alerts.affected"  # the query of what the alerts found, per unit


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
    # Ranks whose recordings ended before the replay's end are stale there: the statuses
    # look back to the first of those ends (and no further: chunks stay short).
    ended = timeline.first_rank_end(config.scrape_interval)
    asked = {
        name: (expr, status_times if over_time else [end])
        for name, (expr, over_time) in _status_queries(
            compiled,
            timeline.training_job,
            end,
            STATUS_POINTS,
            0.0 if ended is None else end - ended + config.scrape_interval,
        ).items()
    }
    if queries is not None:
        # A query of the training processes' series at the end reads them as they were
        # last scraped, when every rank ended before the exporters did (result.Query).
        ended = timeline.training_end(config.scrape_interval)
        training_end = [ended] if ended is not None and ended < end else [end]
        asked.update(
            {
                name: (
                    q.expr,
                    times if q.over_time else training_end if reads_training(q.expr) else [end],
                )
                for name, q in queries(compiled, timeline.training_job, end).items()
            }
        )
    # What each alert found, per unit, at every evaluation (its `affected` recording).
    found_at = [k * evaluation for k in range(1, int(end // evaluation) + 1)]
    asked[AFFECTED] = (affected_selector([f"{JOB_LABEL}={quote(timeline.training_job)}"]), found_at)
    # promtool evaluates the alerts without their hold (it reads their own ALERTS, so a
    # chunk's state would depend on the whole job before it) and reports every active
    # alert; AlertStates then replays `for:` and the hold at each group's own interval.
    groups = without_holds(compiled.groups, compiled.affected, config.job_labels)
    states = AlertStates(compiled.groups, evaluation, holds(compiled.affected))
    # A long job goes through promtool in time chunks (trainprof.replay.chunks); a short
    # one, or one whose rules read back further than a chunk, in one pass.
    plan, need, one_pass = chunks.plan(
        groups, asked, count, config.scrape_interval, evaluation, chunk_instants
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
                groups,
                config.scrape_interval,
                evaluation,
                Path(tmp),
                promtool,
                asked,
                ordered=exporters is not None,
                active=True,
            )
        else:
            run = run_rules(
                groups,
                scraped.series,
                config.scrape_interval,
                evaluation,
                scraped.end,
                Path(tmp),
                promtool,
                queries=asked,
                # trainprof.sources' recordings are read by the later groups: first, always.
                ordered=exporters is not None,
                active=True,
            )
    scraped.series.close()
    # Each alert as its own group's interval evaluates it (the alert groups beside a 15 s
    # trainprof.sources group evaluate every minute), with `for:` and its hold.
    firing = states.firing(run.firing, scraped.end)
    by_time = run.queries.pop(AFFECTED, {})
    found = units_found(
        {scraped.start + t: samples for t, samples in by_time.items()},
        compiled.affected,
        config.job_labels,
    )
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
        verdict.affected = found.get(name, [])
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
    compiled: Compiled, job: str, seconds: float, points: int, lookback: float
) -> dict[str, tuple[str, bool]]:
    from trainprof.report.queries import grafana_builtins

    interval = compiled.config.scrape_interval
    step = query_step(seconds, interval, points)
    builtins = grafana_builtins(seconds, step, interval)
    return status_queries(compiled, job, None, builtins, lookback)


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

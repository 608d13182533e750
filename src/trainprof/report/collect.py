"""Getting the report's numbers: from a Prometheus server, or from a replay.

Both run the same queries (`report.queries`) and end in a `Collected`: every query's series,
and each rule's alerts with the time each started firing. Prometheus is read through
`engines.prometheus_api`; this module decides what to ask it and shapes the answers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import re
from collections.abc import Callable, Iterator, Mapping

from trainprof.contract.metrics import TRAINING_START_TIMESTAMP_SECONDS
from trainprof.contract.names import JOB_LABEL
from trainprof.dashboards.queries import presence, presence_names
from trainprof.engines.prometheus_api import (
    Access,
    Points,
    PrometheusAPI,
    PrometheusAPIError,
    Series,
)
from trainprof.replay import FiredAlert, Query, Verdict, query_step, reads_training, replay
from trainprof.report.queries import ReportQuery, grafana_builtins, resolved
from trainprof.rules.compiler import Compiled, compile_rules
from trainprof.rules.config import RulesConfig, alerting
from trainprof.rules.job_alerts import AffectedUnit, affected_selector, units_found
from trainprof.rules.promql import quote
from trainprof.rules.status import RuleStatus, decide, status_queries

POINTS = 200


class ReportError(Exception):
    """Input the report cannot use; `bad_input` separates a user's mistake (exit 2) from a
    failure of something the report needed (exit 1)."""

    def __init__(self, message: str, bad_input: bool = True):
        super().__init__(message)
        self.bad_input = bad_input


@dataclasses.dataclass
class Collected:
    training_job: str
    source: str  # where the numbers come from, for people
    start: float
    end: float
    step: float
    compiled: Compiled  # the rules the job was watched with, compiled once for the report
    queries: dict[str, ReportQuery]
    results: dict[str, Series]
    verdicts: dict[str, Verdict]
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def config(self) -> RulesConfig:
        return self.compiled.config


# Queries whose values are Unix times (x scale): replay shifts them to promtool's clock.
_TIME_QUERIES = {
    "summary.start": 1000.0,
    "phases.start": 1.0,
    "phases.first_step": 1.0,
    "phases.last_step": 1.0,
}

# --- replay ----------------------------------------------------------------------------------


def from_replay(
    source: str,
    rules: str | None,
    scrape_interval: float = 15.0,
    training_job: str | None = None,
    promtool: str | None = None,
    sources: tuple[str, ...] | None = None,
    extra: Callable[[Compiled], Mapping[str, ReportQuery]] | None = None,
) -> Collected:
    """Replay `source` (SageMaker profiler output or a trainprof recording) through the
    rules and evaluate the report's queries over it with promtool; `sources` as `trainprof
    replay --source`; `extra`: more queries in the dashboard's variables (the compare
    report's), given the compiled rules."""
    asked: dict[str, ReportQuery] = {}

    def build(compiled: Compiled, job: str, seconds: float) -> dict[str, Query]:
        step = query_step(seconds, compiled.config.scrape_interval, POINTS)
        more = extra(compiled) if extra else None
        asked.update(resolved(compiled, job, None, seconds, step, more))
        return {name: Query(q.expr, q.over_time) for name, q in asked.items()}

    result = replay(
        source,
        rules,
        scrape_interval=scrape_interval,
        training_job=training_job,
        promtool=promtool,
        queries=build,
        query_points=POINTS,
        sources=sources,
    )
    results: dict[str, Series] = {}
    for name, by_time in result.queries.items():
        grouped: dict[tuple, Points] = {}
        for t, samples in sorted(by_time.items()):
            for labels, value in samples:
                grouped.setdefault(tuple(sorted(labels.items())), []).append((t, value))
        results[name] = [(dict(key), points) for key, points in grouped.items()]
    # promtool's clock starts at the replay's t0; series holding Unix times were shifted.
    for name, scale in _TIME_QUERIES.items():
        results[name] = [
            (labels, [(t, v + result.start * scale) for t, v in points])
            for labels, points in results.get(name, [])
        ]
    seconds = result.end - result.start
    notes = list(result.notes)
    if result.health:
        notes += [
            f"{a.labels.get('alertname')}: {a.labels.get('affects', '')}" for a in result.health
        ]
    return Collected(
        training_job=result.training_job,
        source=f"replay of {source}",
        start=result.start,
        end=result.end,
        step=query_step(seconds, result.scrape_interval, POINTS),
        compiled=result.compiled,
        queries=asked,
        results=results,
        verdicts={
            i.spec.name: result.rules.get(i.spec.name, Verdict()) for i in alerting(result.config)
        },
        notes=notes,
    )


def from_trial(
    source: str,
    rules: str | None,
    training_job: str | None = None,
    promtool: str | None = None,
) -> Collected:
    """Replay a SageMaker Debugger tensor trial through the tensor rules (default: every
    tensor rule with SageMaker's defaults), as `trainprof replay DIR` does; the report shows
    each rule's verdict with the training step it first fired at. A trial holds no system
    or step-time series, so those sections say so."""
    from trainprof.replay import smdebug
    from trainprof.replay.tensors import replay_trial
    from trainprof.rules.files import read_config
    from trainprof.rules.tensors import default_tensor_config

    config = read_config(rules) if rules else default_tensor_config()
    try:
        trial = smdebug.read_trial(source)
        result = replay_trial(source, config, training_job=training_job, promtool=promtool)
    except smdebug.TrialError as e:
        raise ReportError(str(e)) from e
    # the trial's steps are read one at a time: its first and last wall times, not a list
    first, last = float("inf"), float("-inf")
    for events in trial.steps.values():
        for saved in events:
            first, last = min(first, saved.wall_time), max(last, saved.wall_time)
    start = first if first != float("inf") else 0.0
    end = max(last, trial.end_time or start)
    verdicts = {}
    for name, v in result.rules.items():
        # datapoints: the saved steps at which the rule had its input (None: not counted)
        status = RuleStatus(v.status, datapoints=v.datapoints, reason=v.reason)
        alerts = [FiredAlert(a.labels, a.fired_at, a.step) for a in v.alerts]
        verdicts[name] = Verdict(alerts, status, [u for u, _, _ in v.affected])
    return Collected(
        training_job=result.training_job,
        source=f"replay of the tensor trial {source}",
        start=start,
        end=max(end, start + 1.0),
        step=query_step(max(end - start, 1.0), 1.0, POINTS),
        compiled=compile_rules(config),
        queries={},
        results={},
        verdicts={i.spec.name: verdicts.get(i.spec.name, Verdict()) for i in alerting(config)},
        notes=list(result.notes),
    )


# --- Prometheus ------------------------------------------------------------------------------


@contextlib.contextmanager
def _as_report_error() -> Iterator[None]:
    """The client's failures as the report's own (`ReportError`, with the same exit code)."""
    try:
        yield
    except PrometheusAPIError as e:
        raise ReportError(str(e), e.bad_input) from None


def parse_time(text: str, now: float) -> float:
    """Unix seconds, RFC 3339 (2026-07-10T10:00:00Z), or now / now-3h."""
    from trainprof.contract.durations import parse_duration

    text = text.strip()
    if text == "now":
        return now
    match = re.fullmatch(r"now-(.+)", text)
    if match:
        return now - parse_duration(match.group(1))
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time (examples: now-3h, 1783677636, 2026-07-10T10:00:00Z)"
        ) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.timezone.utc)
    return stamp.timestamp()


def _presence(job: str, namespace: str | None, source: tuple[str, ...]) -> list[str]:
    """Selectors of the series that say the job existed (one per metric name, so functions
    that drop the name cannot collide)."""
    return [_selector(name, job, namespace) for name in presence_names(source)]


def _selector(name: str, job: str, namespace: str | None) -> str:
    matchers = {JOB_LABEL: job}
    if namespace is not None:
        matchers["namespace"] = namespace
    inner = ", ".join(f"{k}={quote(v)}" for k, v in matchers.items())
    return f"{name}{{{inner}}}"


def _extreme(
    api: PrometheusAPI, op: str, selectors: list[str], seconds: float, at: float
) -> float | None:
    """The first (op=min) or last (op=max) time any of `selectors` had a sample within
    `seconds` before `at`: found coarsely (about 5000 steps), then to the second."""
    from trainprof.contract.durations import format_duration

    def search(window: float, resolution: float, when: float) -> float | None:
        found = []
        for sel in selectors:
            expr = (
                f"{op}({op}_over_time(timestamp({sel})"
                f"[{format_duration(math.ceil(window))}:{format_duration(resolution)}]))"
            )
            found += [points[0][1] for _, points in api.instant(expr, when)]
        return (min if op == "min" else max)(found) if found else None

    resolution = max(15, math.ceil(seconds / 5000))
    coarse = search(seconds, resolution, at)
    if coarse is None:
        # Steps are aligned to multiples of the resolution: a job younger than one step
        # can fall between the last step and `at`.
        return search(min(seconds, 3 * resolution), 1, at)
    # The coarse steps see a sample up to one step late: look again around it.
    when = min(coarse + resolution, at) if op == "min" else at
    window = 3 * resolution if op == "min" else min(seconds, at - coarse + 2 * resolution)
    return search(window, 1, when) or coarse


@_as_report_error()
def from_prometheus(
    url: str,
    training_job: str,
    config: RulesConfig,
    start: float | None = None,
    end: float | None = None,
    namespace: str | None = None,
    now: float | None = None,
    access: Access | None = None,
    run: str | None = None,
    timeout: float = 60.0,
    loaded: bool = False,
    extra: Callable[[Compiled], Mapping[str, ReportQuery]] | None = None,
) -> Collected:
    """Query Prometheus for one job. Without `start`/`end`, the job's first and last
    samples within the last week (and before now). A job name used by several runs (a
    resubmitted job) is narrowed to one run: the latest, or `run` (its number or start).
    `timeout`: seconds each request may take in all. `loaded`: judge the trainprof rules
    Prometheus evaluates (`report.loaded`), with `config`'s other settings; `config`
    itself when it evaluates none. `extra` as with `from_replay`."""
    import time

    api = PrometheusAPI(url, timeout=timeout, access=access)
    now = now if now is not None else time.time()
    notes: list[str] = []
    rule_groups = None
    if loaded:
        config, rule_groups = _loaded_rules(api, config, notes)
    presence = _presence(training_job, namespace, config.source)
    asked_start, asked_end = start, end
    if end is None or start is None:
        week = 7 * 86400
        first = _extreme(api, "min", presence, week, now)
        last = _extreme(api, "max", presence, week, now)
        if first is None or last is None:
            raise ReportError(
                _no_such_job(api, training_job, namespace, "in the last week", config.source)
            )
        start = start if start is not None else first
        end = end if end is not None else min(last + 15, now)
    if end > start:
        runs = find_runs(api, training_job, namespace, start, end)
        if len(runs) > 1 or (run is not None and runs):
            index = pick_run(runs, run)
            chosen = runs[index]
            if asked_start is None:
                start = max(start, min(chosen.started, chosen.first))
            if asked_end is None and index + 1 < len(runs):
                # The next run began when its first process started (seen a scrape later).
                end = min(end, min(runs[index + 1].first, runs[index + 1].started) - 1)
            notes.append(
                f"{len(runs)} runs of {training_job} (told apart by their start time): "
                + "; ".join(f"run {i + 1} started {_utc(r.started)}" for i, r in enumerate(runs))
                + f". This report covers run {index + 1}"
                + ("" if run is not None else " (the latest; --run N picks another)")
            )
        elif run is not None:
            raise ReportError(
                f"--run {run}: no start time (trainprof_training_start_timestamp_seconds) "
                f"of {training_job} to tell runs apart by"
            )
    if end <= start:
        raise ReportError(f"--to ({end:.0f}) must be after --from ({start:.0f})")
    step = max(float(math.ceil((end - start) / POINTS)), config.scrape_interval, 1.0)
    if _extreme(api, "max", presence, end - start, end) is None:
        raise ReportError(
            _no_such_job(api, training_job, namespace, "in that time range", config.source)
        )

    compiled = compile_rules(config)
    more = extra(compiled) if extra else None
    queries = resolved(compiled, training_job, namespace, end - start, step, more)
    # The training processes' series read at the end as they were last scraped: stale
    # after the ranks ended while the exporters went on (replay.Query says the same).
    ranks = _selector(TRAINING_START_TIMESTAMP_SECONDS, training_job, namespace)
    training_end = _extreme(api, "max", [ranks], end - start, end) or end
    results: dict[str, Series] = {}
    for name, q in queries.items():
        if q.over_time:
            results[name] = api.range(q.expr, start, end, step)
        else:
            at = min(end, training_end) if reads_training(q.expr) else end
            results[name] = api.instant(q.expr, at)
    window = _Window(api, compiled, training_job, namespace, start, end)
    verdicts = _verdicts(window, rule_groups)
    builtins = grafana_builtins(end - start, step, config.scrape_interval)
    for name, (expr, over_time) in status_queries(
        compiled, training_job, namespace, builtins
    ).items():
        results[name] = api.range(expr, start, end, step) if over_time else api.instant(expr, end)
    found = _affected(window)
    for name, verdict in verdicts.items():
        verdict.status = decide(compiled, name, verdict.fired, results)
        verdict.affected = found.get(name, [])
    return Collected(
        training_job=training_job,
        source=f"Prometheus at {api.url}",
        start=start,
        end=end,
        step=step,
        compiled=compiled,
        queries=queries,
        results=results,
        verdicts=verdicts,
        notes=notes,
    )


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a job name: when its processes started, and when it was first and last
    seen holding that start time."""

    started: float
    first: float
    last: float


def find_runs(
    api: PrometheusAPI, job: str, namespace: str | None, start: float, end: float
) -> list[Run]:
    """The runs of `job` between `start` and `end`, oldest first: each distinct value of
    the job's earliest process start time (a resubmitted job starts again)."""
    matchers = _job_matchers(job, namespace)
    expr = f"min(trainprof_training_start_timestamp_seconds{{{', '.join(matchers)}}})"
    step = max(15.0, float(math.ceil((end - start) / 10_000)))
    runs: dict[float, list[float]] = {}
    for _, points in api.range(expr, start, end, step):
        for t, value in points:
            if math.isnan(value):
                continue
            key = next((k for k in runs if abs(k - value) < 1.0), value)
            seen = runs.setdefault(key, [t, t])
            seen[0], seen[1] = min(seen[0], t), max(seen[1], t)
    return sorted((Run(k, a, b) for k, (a, b) in runs.items()), key=lambda r: r.started)


def pick_run(runs: list[Run], run: str | None) -> int:
    """The index of the run asked for: None = the latest, N = the N-th (from 1), or a time
    (Unix seconds or RFC 3339) within a minute of a run's start."""
    if run is None:
        return len(runs) - 1
    listed = ", ".join(f"{i + 1} ({_utc(r.started)})" for i, r in enumerate(runs))
    text = run.strip()
    if text.isdigit() and int(text) < 10_000:  # a run number, not a Unix time
        if 1 <= int(text) <= len(runs):
            return int(text) - 1
    else:
        try:
            at = parse_time(text, 0.0)
        except ValueError:
            at = math.nan
        for i, r in enumerate(runs):
            if abs(r.started - at) <= 60:
                return i
    raise ReportError(f"--run {run}: no such run; the runs are {listed}")


def _utc(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )


def _no_such_job(
    api: PrometheusAPI, job: str, namespace: str | None, where: str, source: tuple[str, ...]
) -> str:
    import difflib

    known = api.label_values(JOB_LABEL, presence(source))
    close = difflib.get_close_matches(job, known, n=3)
    message = f"no trainprof series with training_job={job!r}"
    if namespace is not None:
        message += f" in namespace {namespace!r}"
    message += f" {where}"
    if close:
        message += f"; did you mean {', '.join(close)}?"
    elif known:
        message += f"; jobs Prometheus knows: {', '.join(sorted(known)[:10])}"
    return message


def _loaded_rules(
    api: PrometheusAPI, config: RulesConfig, notes: list[str]
) -> tuple[RulesConfig, list[dict] | None]:
    """The configuration of the trainprof rules Prometheus evaluates, and their groups (for
    the verdicts); `config` and None when it evaluates none or cannot say."""
    from trainprof.report.loaded import as_compiled, loaded_config

    fallback = "the report judges SageMaker's default ProfilerReport (--rules FILE names another)"
    try:
        groups = api.rule_groups()
        if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
            raise TypeError("/api/v1/rules: no list of rule groups")
    except (PrometheusAPIError, KeyError, TypeError) as e:
        # A compatible API without rules (a bare TSDB, a ruler elsewhere): say so, go on.
        notes.append(f"which rules Prometheus evaluates is unknown ({e}): {fallback}")
        return config, None
    found, said = loaded_config(groups, config)
    notes += said
    if found is None:
        notes.append(f"Prometheus evaluates no trainprof rules: {fallback}")
        return config, None
    return found, as_compiled(groups)


@dataclasses.dataclass(frozen=True)
class _Window:
    """The job whose rules' verdicts a report reads, and the range it reads them over."""

    api: PrometheusAPI
    compiled: Compiled
    job: str
    namespace: str | None
    start: float
    end: float

    def step(self, interval: float) -> float:
        """`interval`, or wider where the range would need more than 10,000 points."""
        return max(interval, (self.end - self.start) / 10_000)


def _job_matchers(job: str, namespace: str | None) -> list[str]:
    """The label matchers of one job's series (in `namespace` where given).

    >>> _job_matchers("bert", None), _job_matchers("bert", "team-a")
    (['training_job="bert"'], ['training_job="bert"', 'namespace="team-a"'])
    """
    return [f"{JOB_LABEL}={quote(job)}"] + (
        [] if namespace is None else [f"namespace={quote(namespace)}"]
    )


def _verdicts(w: _Window, groups: list[dict] | None = None) -> dict[str, Verdict]:
    """Each rule's alerts with the evaluation at which each started firing, derived from the
    alert's own expression and `for:` over the range (stored ALERTS samples can be missing,
    and are only seen to a query step); `groups`: the rules as Prometheus evaluates them
    (default: as compiled)."""
    from trainprof.contract.durations import parse_duration

    api, job, namespace, start, end = w.api, w.job, w.namespace, w.start, w.end
    config = w.compiled.config
    verdicts = {i.spec.name: Verdict() for i in alerting(config)}
    slack: dict[str, float] = {i.spec.name: 0.0 for i in alerting(config)}
    for group in w.compiled.groups if groups is None else groups:
        step = w.step(parse_duration(group["interval"]))
        for rule in group["rules"]:
            name = (rule.get("labels") or {}).get("rule")
            if "alert" not in rule or name not in verdicts:
                continue
            hold = parse_duration(rule["for"]) if rule.get("for") else 0.0
            # Look back far enough that an alert already pending at `start` is seen.
            series = api.range(rule["expr"], start - hold - step, end, step)
            for labels, points in series:
                if labels.get(JOB_LABEL) != job:
                    continue
                if namespace is not None and labels.get("namespace") != namespace:
                    continue
                labels = {
                    **{k: v for k, v in labels.items() if k != "__name__"},
                    **rule.get("labels", {}),
                    "alertname": rule["alert"],
                }
                for fired_at in _firing_edges([t for t, _ in points], step, hold):
                    if start - 1e-9 <= fired_at <= end + 1e-9:
                        verdicts[name].alerts.append(FiredAlert(dict(labels), fired_at))
            slack[name] = max(slack.get(name, 0.0), hold + 2 * step)
    # The rule manager may have fired an alert in the last evaluations, before its
    # expression's recordings reach the range's end: keep what ALERTS saw and the
    # expressions did not.
    for name, alerts in _alerts_series(w).items():
        derived = verdicts[name].alerts
        for alert in alerts:
            if not any(
                a.labels == alert.labels and abs(a.fired_at - alert.fired_at) <= slack[name]
                for a in derived
            ):
                derived.append(alert)
    for verdict in verdicts.values():
        verdict.alerts.sort(key=lambda a: a.fired_at)
    return verdicts


def _affected(w: _Window) -> dict[str, list[AffectedUnit]]:
    """Each rule's units its alerts found over the range (their `affected` recordings),
    read at the fastest rule group's interval."""
    config = w.compiled.config
    step = w.step(min((i.evaluation_interval for i in alerting(config)), default=60.0))
    selector = affected_selector(_job_matchers(w.job, w.namespace))
    by_time: dict[float, list[tuple[dict[str, str], float]]] = {}
    for labels, points in w.api.range(selector, w.start, w.end, step):
        for t, value in points:
            by_time.setdefault(t, []).append((labels, value))
    return units_found(by_time, w.compiled.affected, config.job_labels)


def _alerts_series(w: _Window) -> dict[str, list[FiredAlert]]:
    """Each rule's rising edges of ALERTS at its evaluation interval."""
    out: dict[str, list[FiredAlert]] = {}
    for instance in alerting(w.compiled.config):
        step = w.step(instance.evaluation_interval)
        matchers = [
            'alertstate="firing"',
            f"rule={quote(instance.spec.name)}",
            *_job_matchers(w.job, w.namespace),
        ]
        found = out.setdefault(instance.spec.name, [])
        selector = "ALERTS{" + ", ".join(matchers) + "}"
        for labels, points in w.api.range(selector, w.start, w.end, step):
            labels = {k: v for k, v in labels.items() if k not in ("__name__", "alertstate")}
            previous = None
            for t, _ in points:
                if previous is None or t - previous > step * 1.5:
                    found.append(FiredAlert(dict(labels), t))
                previous = t
    return out


def _firing_edges(times: list[float], step: float, hold: float) -> list[float]:
    """When an alert true at `times` (evaluations `step` apart) started firing: as
    Prometheus does, the first evaluation at least `hold` after it became active, without
    a gap."""
    edges: list[float] = []
    active, firing, previous = 0.0, False, None
    for t in sorted(times):
        if previous is None or t - previous > step * 1.5:
            active, firing = t, False
        if not firing and t - active >= hold - 1e-9:
            edges.append(t)
            firing = True
        previous = t
    return edges

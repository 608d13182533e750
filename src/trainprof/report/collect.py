"""Getting the report's numbers: from a Prometheus server, or from a replay.

Both run the same queries (`report.queries`) and end in a `Collected`: every query's series,
and each rule's alerts with the time each started firing.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from trainprof.dashboards.queries import PRESENCE
from trainprof.replay import FiredAlert, Query, Verdict, query_step, replay
from trainprof.report.queries import ReportQuery, resolved
from trainprof.rules.compiler import Compiled, compile_rules
from trainprof.rules.config import RulesConfig, alerting
from trainprof.rules.promql import quote

Points = list[tuple[float, float]]
Series = list[tuple[dict[str, str], Points]]
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


# --- replay ----------------------------------------------------------------------------------


def from_replay(
    source: str,
    rules: str | None,
    scrape_interval: float = 15.0,
    training_job: str | None = None,
    promtool: str | None = None,
) -> Collected:
    """Replay `source` (SageMaker profiler output or a trainprof recording) through the
    rules and evaluate the report's queries over it with promtool."""
    asked: dict[str, ReportQuery] = {}

    def build(compiled: Compiled, job: str, seconds: float) -> dict[str, Query]:
        step = query_step(seconds, compiled.config.scrape_interval, POINTS)
        asked.update(resolved(compiled, job, None, seconds, step))
        return {name: Query(q.expr, q.over_time) for name, q in asked.items()}

    result = replay(
        source,
        rules,
        scrape_interval=scrape_interval,
        training_job=training_job,
        promtool=promtool,
        queries=build,
        query_points=POINTS,
    )
    results: dict[str, Series] = {}
    for name, by_time in result.queries.items():
        grouped: dict[tuple, Points] = {}
        for t, samples in sorted(by_time.items()):
            for labels, value in samples:
                grouped.setdefault(tuple(sorted(labels.items())), []).append((t, value))
        results[name] = [(dict(key), points) for key, points in grouped.items()]
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


# --- Prometheus ------------------------------------------------------------------------------


class Prometheus:
    """The few calls of Prometheus' HTTP API the report makes."""

    def __init__(self, url: str, timeout: float = 60.0):
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ReportError(
                f"--prometheus {url!r} is not an http(s) URL (e.g. http://prometheus:9090)"
            )
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: dict[str, str]) -> Any:
        """The `data` of Prometheus' answer: a dict for queries, a list for label values."""
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as response:
                doc = json.loads(response.read())
        except urllib.error.HTTPError as e:
            try:
                body = json.loads(e.read())
                message = body["error"]
            except (ValueError, KeyError, TypeError):
                # Prometheus explains a refused query in JSON; anything else is not it.
                raise ReportError(
                    f"{self.url} did not answer like Prometheus (HTTP {e.code} "
                    f"for {path}): is it the Prometheus URL?",
                    bad_input=False,
                ) from None
            raise ReportError(
                f"Prometheus at {self.url} rejected a query: {message}\n{params.get('query', '')}",
                bad_input=False,
            ) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ReportError(
                f"cannot reach Prometheus at {self.url}: {reason}", bad_input=False
            ) from None
        except ValueError:
            raise ReportError(
                f"{self.url} did not answer like Prometheus (not JSON)", bad_input=False
            ) from None
        if doc.get("status") != "success":
            raise ReportError(f"Prometheus at {self.url}: {doc.get('error', doc)}", bad_input=False)
        return doc["data"]

    def instant(self, expr: str, at: float) -> Series:
        data = self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        if data["resultType"] == "scalar":
            return [({}, [(at, float(data["result"][1]))])]
        return [(r["metric"], [(at, float(r["value"][1]))]) for r in data["result"]]

    def range(self, expr: str, start: float, end: float, step: float) -> Series:
        """Values at `end` and every `step` before it back to `start` (Prometheus counts
        steps from the start; counting from the end keeps the last value at `end`)."""
        start = end - math.ceil((end - start) / step - 1e-9) * step
        data = self._get(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
        return [
            (r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in data["result"]
        ]

    def label_values(self, label: str, match: str) -> list[str]:
        return self._get(f"/api/v1/label/{label}/values", {"match[]": match})


def parse_time(text: str, now: float) -> float:
    """Unix seconds, RFC 3339 (2026-07-10T10:00:00Z), or now / now-3h."""
    from trainprof.durations import parse_duration

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


def _presence(job: str, namespace: str | None) -> list[str]:
    """Selectors of the series that say the job existed (one per metric name, so functions
    that drop the name cannot collide)."""
    matchers = {"training_job": job}
    if namespace is not None:
        matchers["namespace"] = namespace
    inner = ", ".join(f"{k}={quote(v)}" for k, v in matchers.items())
    return [f"{name}{{{inner}}}" for name in PRESENCE]


def _extreme(
    api: Prometheus, op: str, selectors: list[str], seconds: float, at: float
) -> float | None:
    """The first (op=min) or last (op=max) time any of `selectors` had a sample within
    `seconds` before `at`: found coarsely (about 5000 steps), then to the second."""
    from trainprof.durations import format_duration

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


def from_prometheus(
    url: str,
    training_job: str,
    config: RulesConfig,
    start: float | None = None,
    end: float | None = None,
    namespace: str | None = None,
    now: float | None = None,
) -> Collected:
    """Query Prometheus for one job. Without `start`/`end`, the job's first and last
    samples within the last week (and before now)."""
    import time

    api = Prometheus(url)
    now = now if now is not None else time.time()
    presence = _presence(training_job, namespace)
    if end is None or start is None:
        week = 7 * 86400
        first = _extreme(api, "min", presence, week, now)
        last = _extreme(api, "max", presence, week, now)
        if first is None or last is None:
            raise ReportError(_no_such_job(api, training_job, namespace, "in the last week"))
        start = start if start is not None else first
        end = end if end is not None else min(last + 15, now)
    if end <= start:
        raise ReportError(f"--to ({end:.0f}) must be after --from ({start:.0f})")
    step = max(float(math.ceil((end - start) / POINTS)), config.scrape_interval, 1.0)
    if _extreme(api, "max", presence, end - start, end) is None:
        raise ReportError(_no_such_job(api, training_job, namespace, "in that time range"))

    compiled = compile_rules(config)
    queries = resolved(compiled, training_job, namespace, end - start, step)
    results: dict[str, Series] = {}
    for name, q in queries.items():
        results[name] = (
            api.range(q.expr, start, end, step) if q.over_time else api.instant(q.expr, end)
        )
    verdicts = _verdicts(api, config, training_job, namespace, start, end)
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
    )


def _no_such_job(api: Prometheus, job: str, namespace: str | None, where: str) -> str:
    import difflib

    known = api.label_values("training_job", f'{{__name__=~"{"|".join(PRESENCE)}"}}')
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


def _verdicts(
    api: Prometheus, config: RulesConfig, job: str, namespace: str | None, start: float, end: float
) -> dict[str, Verdict]:
    """Each rule's alerts with the evaluation at which each started firing: the rising
    edges of ALERTS at the rule's evaluation interval, as replay reports them."""
    verdicts = {i.spec.name: Verdict() for i in alerting(config)}
    for instance in alerting(config):
        step = instance.evaluation_interval
        step = max(step, (end - start) / 10_000)  # Prometheus answers 11,000 points at most
        matchers = [
            'alertstate="firing"',
            f"rule={quote(instance.spec.name)}",
            f"training_job={quote(job)}",
        ]
        if namespace is not None:
            matchers.append(f"namespace={quote(namespace)}")
        for labels, points in api.range("ALERTS{" + ", ".join(matchers) + "}", start, end, step):
            labels = {k: v for k, v in labels.items() if k not in ("__name__", "alertstate")}
            previous = None
            for t, _ in points:
                if previous is None or t - previous > step * 1.5:
                    verdicts[instance.spec.name].alerts.append(FiredAlert(dict(labels), t))
                previous = t
    for verdict in verdicts.values():
        verdict.alerts.sort(key=lambda a: a.fired_at)
    return verdicts

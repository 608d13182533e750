"""What each rule decided, and what it could not: fired, quiet, no data, not applicable.

A rule that never saw its input (StepOutlier with no steps recorded) or that does not apply
(LoadBalancing with one GPU per node) is not "ok": it decided nothing. Replay and the report
evaluate the same queries (`status_queries`) over their series, through promtool or
Prometheus, and `decide` turns the answers into a status and a measure, SageMaker's
"datapoints analysed" and how close the rule came to its threshold:

    >>> from trainprof.replay import replay
    >>> result = replay("tests/data/real-sagemaker/trimcrae-8xtt-redock", None)
    >>> result.rules["CPUBottleneck"].status.as_json()  # doctest: +NORMALIZE_WHITESPACE
    {'status': 'quiet', 'datapoints': 1422, 'measured': {'value': 0.4641, 'peak': 0.7403,
     'threshold': 0.5, 'fires': 'above', 'parameter': 'threshold = 50%', 'unit': 'percentunit'}}
"""

from __future__ import annotations

import dataclasses
import math

from trainprof.contract import metrics as contract
from trainprof.contract.durations import format_duration, parse_duration
from trainprof.dashboards.queries import JOB_VARIABLES, Scope, interpolate, one_job
from trainprof.engines.promtool import SAFE_SCRAPES
from trainprof.rules.compiler import Compiled, MissingRecording
from trainprof.rules.model import Signal
from trainprof.rules.promql import quote
from trainprof.sources.gauges import NODE_SCRAPES, gauges_for

FIRED, QUIET, NO_DATA, NOT_APPLICABLE = "fired", "quiet", "no_data", "not_applicable"
STATUSES = (FIRED, QUIET, NO_DATA, NOT_APPLICABLE)


@dataclasses.dataclass
class Measure:
    """The rule's signal against its threshold: at the end and at its closest approach
    (the highest value for a rule firing above its threshold, the lowest for below)."""

    value: float | None
    peak: float | None
    threshold: float
    fires: str
    parameter: str
    unit: str

    def as_json(self) -> dict:
        return {
            "value": _round(self.value),
            "peak": _round(self.peak),
            "threshold": self.threshold,
            "fires": self.fires,
            "parameter": self.parameter,
            "unit": self.unit,
        }


@dataclasses.dataclass
class RuleStatus:
    status: str
    datapoints: int | None = None
    measure: Measure | None = None
    reason: str = ""  # why no_data / not_applicable, for people

    def as_json(self) -> dict:
        return {
            "status": self.status,
            "datapoints": self.datapoints,
            "measured": self.measure.as_json() if self.measure else None,
        }


def measured_text(measure: Measure | None) -> str:
    """'46% (peak 74%) vs above 50%': at the end, the extreme, the threshold."""
    if measure is None:
        return "-"

    def show(v: float | None) -> str:
        if v is None:
            return "-"
        if measure.unit == "percentunit":
            return f"{v * 100:.0f}%"
        if measure.unit == "s":
            return f"{v:.0f}s"
        return f"{v:.3g}"

    return (
        f"{show(measure.value)} (peak {show(measure.peak)}) vs "
        f"{measure.fires} {show(measure.threshold)}"
    )


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def _signals(compiled: Compiled, name: str) -> tuple[Signal, ...]:
    if compiled.rule(name) is None:
        return ()
    try:
        return compiled.signals(name, Scope(compiled.config, JOB_VARIABLES))
    except (KeyError, MissingRecording):  # a summary rule with no signal, or one left out
        return ()


def status_queries(
    compiled: Compiled,
    training_job: str,
    namespace: str | None,
    builtins: dict[str, str],
    lookback: float | None = None,
) -> dict[str, tuple[str, bool]]:
    """name -> (PromQL, over the range?) of everything `decide` needs. The steps, ranks
    and samples count every series seen in the `lookback` seconds before the end (default:
    the whole range): a rank or exporter that ended before the end still counts."""
    values = one_job(training_job, namespace)
    matchers = [f"training_job={quote(training_job)}"]
    if namespace is not None:
        matchers.append(f"namespace={quote(namespace)}")
    sel = "{" + ", ".join(matchers) + "}"
    span = parse_duration(builtins.get("__range", "1h"))
    piece = SAFE_SCRAPES * compiled.config.scrape_interval
    back = span if lookback is None else min(lookback, span)

    def seen(selector: str) -> str:
        return latest(selector, back, piece) if back > 0 else selector

    samples = f"sum({seen(f'{contract.SAMPLES_TOTAL}{sel}')})"
    gpus = f"trainprof_gpu_utilization_sampled_ratio_count{sel}"
    gauges = gauges_for(compiled.config.source)
    host = gauges.get(contract.CPU_UTILIZATION_SAMPLED_RATIO)
    gpu = gauges.get(contract.GPU_UTILIZATION_SAMPLED_RATIO)
    out: dict[str, tuple[str, bool]] = {"status.samples": (samples, False)}
    if host or gpu:
        # A source adapter's datapoints are its scrapes of each node, counted per job at
        # each scrape; in pieces, as promtool refuses a range of more than 10,000 samples.
        for k in range(max(1, math.ceil(span / piece))):
            length = format_duration(min(piece, span - k * piece))
            offset = f" offset {format_duration(k * piece)}" if k else ""
            counted = f"sum(sum_over_time({NODE_SCRAPES}{sel}[{length}]{offset}))"
            out[f"status.samples.{k}" if k else "status.samples"] = (counted, False)
    if gpu:
        gpus = f"{gpu}{sel}"
    # Ranks and exporters that ended before the range did (their series stale there) count.
    out |= {
        "status.steps": (f"sum({seen(f'{contract.TRAINING_STEPS_TOTAL}{sel}')})", False),
        "status.ranks": (
            f"count({seen(f'{contract.TRAINING_START_TIMESTAMP_SECONDS}{sel}')})",
            False,
        ),
        "status.gpus_per_node": (f"max(count by (node) ({seen(gpus)}))", False),
    }
    for instance in compiled.alerting:
        for i, signal in enumerate(_signals(compiled, instance.spec.name)):
            expr = interpolate(signal.expr, values, builtins)
            name = f"status.{instance.spec.name}.{i}"
            # The value at the end, and over the range for its extreme (a subquery over
            # the whole range would be cheaper but hits promtool's sample limit).
            out[name] = (expr, False)
            out[name + ".peak"] = (expr, True)
    return out


def latest(selector: str, span: float, piece: float) -> str:
    """Each series' latest value in the `span` seconds before the evaluation, also of the
    series that ended (went stale) before it: `last_over_time` over pieces of at most
    `piece` seconds (promtool refuses a range of more than 10,000 samples), the most recent
    piece holding the series winning.

    >>> latest('up{job="a"}', 7200, 3600)
    'last_over_time(up{job="a"}[1h]) or last_over_time(up{job="a"}[1h] offset 1h)'
    """
    parts = []
    for k in range(max(1, math.ceil(span / piece))):
        length = format_duration(max(1.0, min(piece, span - k * piece)))
        offset = f" offset {format_duration(k * piece)}" if k else ""
        parts.append(f"last_over_time({selector}[{length}]{offset})")
    return " or ".join(parts)


Results = dict[str, list[tuple[dict[str, str], list[tuple[float, float]]]]]


def _scalar(results: Results, name: str) -> float | None:
    for _, points in results.get(name, []):
        finite = [v for _, v in points if not math.isnan(v)]
        if finite:
            return finite[-1]
    return None


def decide(compiled: Compiled, name: str, fired: bool, results: Results) -> RuleStatus:
    """The rule's status from `status_queries`' results (name -> [(labels, points)])."""
    pieces = [_scalar(results, n) for n in results if n.split(".")[:2] == ["status", "samples"]]
    found = [p for p in pieces if p is not None]
    samples = sum(found) if found else None
    steps = _scalar(results, "status.steps")
    ranks = _scalar(results, "status.ranks")
    gpus_per_node = _scalar(results, "status.gpus_per_node") or 0
    instance = compiled.config.rule(name)
    counts = instance.spec.datapoints if instance else "samples"
    if counts == "steps":
        datapoints = steps
    elif counts == "ranks":
        datapoints = steps if steps else ranks
    else:
        datapoints = samples
    measure = _measure(compiled, name, results)
    count = None if datapoints is None else int(datapoints)
    if fired:
        return RuleStatus(FIRED, count, measure)
    needs = instance.spec.min_gpus_per_node if instance else 0
    if needs and gpus_per_node < needs and samples:
        return RuleStatus(
            NOT_APPLICABLE,
            count,
            measure,
            f"needs {needs} GPUs on a node; the job had at most {gpus_per_node:g}",
        )
    if counts == "steps" and not steps:
        return RuleStatus(NO_DATA, count, None, "no training steps recorded")
    if counts == "ranks" and not ranks and not steps:
        return RuleStatus(NO_DATA, count, None, "no training process recorded")
    signals = _signals(compiled, name)
    if signals and measure is None:
        return RuleStatus(NO_DATA, count, None, "its input series were absent")
    return RuleStatus(QUIET, count, measure)


def _measure(compiled: Compiled, name: str, results: Results) -> Measure | None:
    """The first signal's value at the end (the worst series) and its closest approach."""
    for i, signal in enumerate(_signals(compiled, name)):
        worst = max if signal.threshold.fires == "above" else min
        lasts = _finite(results.get(f"status.{name}.{i}", []))
        peaks = _finite(results.get(f"status.{name}.{i}.peak", []), every=True)
        if not lasts and not peaks:
            continue
        return Measure(
            worst(lasts) if lasts else None,
            worst(peaks + lasts),
            signal.threshold.value,
            signal.threshold.fires,
            signal.threshold.text,
            signal.unit,
        )
    return None


def _finite(series, every: bool = False) -> list[float]:
    """The last finite value of each series (`every`: all of them)."""
    out = []
    for _, points in series:
        finite = [v for _, v in points if not math.isnan(v) and not math.isinf(v)]
        if finite:
            out += finite if every else finite[-1:]
    return out

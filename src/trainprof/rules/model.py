"""What a catalog entry is, and what it compiles to.

A `RuleSpec` is everything trainprof knows about a rule: SageMaker's parameters with their
defaults, the prose (what the rule detects, what to do about it) and functions of a `Build`
(the resolved parameter values plus the deployment facts: datapoint and scrape interval,
patience mode, job selector):

- `build` returns its recording and alerting rules;
- `signals` the series its dashboard row and report section draw, each with the threshold
  the alert compares it with, made from the same parameter;
- `inputs` what the exporters and the training API must count for it
  (`trainprof exporter --rules.config`);
- `health` the alerts that say the exporters do not serve those inputs;
- `state` the job-state alerts it brings (Alertmanager inhibits on them).

Names, durations and selectors are all made by `Build`, so a parameter change moves every
place that depends on it. `trainprof.rules.compiler.compile_rules` runs them all once per
configuration.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from trainprof.contract import metrics as contract
from trainprof.contract.durations import format_duration
from trainprof.contract.names import RECORD_NAME, record_name
from trainprof.rules import promql
from trainprof.rules.params import Param, params_of

__all__ = ["RECORD_NAME"]  # re-exported: tests and dashboards recognise recordings by it
SEVERITIES = ("info", "warning", "critical")
# Rule families, one per catalog module: what kind of trouble a rule points at. Alerting
# inhibitions name families, so a new rule of a family is silenced like its siblings.
FAMILIES = ("bottleneck", "gpu", "framework", "system", "health", "custom")
PATIENCE_MODES = ("auto", "for", "warmup")


@dataclasses.dataclass(frozen=True)
class Recording:
    """A recording rule; its name is `level:metric:operation` (see `names.record_name`)."""

    level: str  # the labels kept: gpu, node, rank_phase, training_job, ...
    metric: str  # the contract metric it is computed from
    operation: str  # what was done to it: ratio, quantile, p95_rate4m10s, ...
    expr: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # Recorded at every scrape (in the `trainprof.sources` group), not at the rule's scan
    # interval: a per-scrape condition on a source adapter's gauges that the rule then
    # counts over a range.
    every_scrape: bool = False

    def __post_init__(self):
        record_name(self.level, self.metric, self.operation)  # raises on a malformed part

    @property
    def record(self) -> str:
        return record_name(self.level, self.metric, self.operation)


@dataclasses.dataclass(frozen=True)
class Population:
    """Every unit of a job a per-unit alert judges, for "5 of 16 GPUs": the series `series`
    (narrowed by `equal` and the rule's job selector), counted once per distinct value of
    `distinct` when several series stand for one unit (a tensor collection's tensors)."""

    series: str
    equal: Mapping[str, str] = dataclasses.field(default_factory=dict)
    distinct: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Units:
    """What a per-unit alert counts. Its expression gives one series per unit (GPU, node,
    rank, collection, ...) that meets the rule's condition; the compiler records them as
    `<level>:trainprof_rule_<rule>:affected` (what the dashboards, the report and replay
    list) and raises one alert per job that counts them, whose description says how many of
    how many and names the worst few."""

    level: str  # the recording's level: gpu, gpu_pair, node, rank, rank_mode, collection, ...
    singular: str  # "GPU"
    plural: str  # "GPUs"
    # Go template naming one unit from a query result (`.Labels`): "{{ .Labels.node }} GPU ..."
    name: str
    # Every unit of the job, for "of how many"; None: the alert says how many, not of what.
    population: Population | None
    value: str = "{{ .Value }}"  # Go template showing a unit's value (`.Value`); "": none
    value_text: str = ""  # what the value is: "share of samples at or below 70%"
    worst: str = "highest"  # highest | lowest: which end of the values is worst

    def __post_init__(self):
        if self.worst not in ("highest", "lowest"):
            raise ValueError(f"units {self.plural}: worst must be highest or lowest")


@dataclasses.dataclass(frozen=True)
class Alert:
    expr: str
    summary: str  # static: identical for every instance of the alert
    # May use {{ $labels.x }} of the job labels and {{ $value }}. With `units`, what an
    # affected unit does, in the plural ("had a 95th percentile below 70% ..."): the
    # compiler writes "Job j: 5 of 16 GPUs <description>. Worst ...: ...".
    description: str
    for_seconds: float = 0.0
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # One series per GPU (a `uuid` label): with `gpu_attribution: assignment` the compiler
    # joins it to the job that holds the GPU (trainprof.rules.attribution).
    per_gpu: bool = False
    # None: the expression gives one series per job already; else what its series are.
    units: Units | None = None
    # Seconds a firing alert keeps firing after its condition last held (noise shorter
    # than this does not resolve it). None: the compiler's default (the rule's patience, at
    # least HOLD_EVALUATIONS evaluations); 0: never held (a condition that cannot flap).
    hold: float | None = None

    def __post_init__(self):
        if "{{" in self.summary:
            raise ValueError(f"alert summary {self.summary!r} must be static (no templates)")
        if self.units is not None and "$labels" in self.description:
            # The compiler names the job; a unit's labels are not the alert's.
            raise ValueError(
                f"alert {self.summary!r}: a per-unit alert's description uses no $labels"
            )


@dataclasses.dataclass(frozen=True)
class RuleOutput:
    recordings: tuple[Recording, ...] = ()
    alerts: tuple[Alert, ...] = ()


@dataclasses.dataclass(frozen=True)
class HealthCheck:
    """An alert of the `trainprof.health` group: the exporters cannot serve this rule."""

    alert: str
    expr: str
    summary: str
    description: str  # with `units`, in the plural, as an Alert's
    units: Units | None = None


@dataclasses.dataclass(frozen=True)
class StateAlert:
    """An alert of the `trainprof.state` group: a job's state, fired at once (no `for:`).
    While it fires, Alertmanager holds back the alerts its rule inhibits (`inhibits`)."""

    alert: str
    expr: str
    summary: str
    description: str
    why: str  # what the state means for those alerts, for the inhibit rule's comment


# --- what a dashboard row and the report draw --------------------------------------------------

RATIO_UNIT, SECONDS_UNIT, NUMBER_UNIT = "percentunit", "s", "none"


@dataclasses.dataclass(frozen=True)
class Threshold:
    value: float  # in the signal's unit
    text: str  # the parameter and its configured value: "threshold_p95 = 70%"
    fires: str  # above | below: on which side of the line the rule fires


def percent_threshold(param: str, value: float, fires: str) -> Threshold:
    """A percentage parameter as the ratio line a signal is drawn against."""
    return Threshold(value / 100, f"{param} = {value:g}%", fires)


@dataclasses.dataclass(frozen=True)
class Signal:
    title: str
    expr: str  # PromQL, narrowed by the scope's variables
    legend: str  # Grafana legend format: "{{node}} GPU {{gpu}}"
    unit: str  # Grafana unit id
    threshold: Threshold


class Selects(Protocol):
    """Where a signal is drawn (`dashboards.queries.Scope`): selectors narrowed by the
    dashboard's variables."""

    def sel(self, series: str, *extra: promql.Matcher, **equal: str) -> str: ...

    @property
    def by_job(self) -> str: ...


class Recordings(Protocol):
    """Every rule's recordings of a compiled configuration (`compiler.Compiled`)."""

    def recording(
        self,
        metric: str,
        level: str | None = None,
        operation: str | None = None,
        rule: str | None = None,
        **labels: str,
    ) -> Recording: ...


# The exporter inputs a rule may ask for, as `trainprof exporter --rules.config` reads them:
# (busy, idle GPU) ratio pairs the bottleneck counters count, and the step-outlier factors.
# The training-health inputs are what `trainprof.torch.watch(rules_config=...)` computes.
INPUTS = (
    "cpu_bottleneck",
    "io_bottleneck",
    "step_outlier_stddevs",
    "loss_num_steps",
    "loss_delta",
    "unchanged_tolerance",
    "threshold_inactivity",
    "token_values",
)


P = TypeVar("P")


@dataclasses.dataclass(frozen=True)
class RuleSpec(Generic[P]):
    name: str  # SageMaker's rule name; also the `rule` label
    summary: str  # one line, for tables
    detects: str  # what it detects, for docs and the dashboard
    recommendation: str  # SageMaker report's advice, in our words
    severity: str  # info | warning | critical
    # A frozen dataclass, one `params.param(...)` field per parameter; `Build.p` is one.
    parameters: type[P]
    build: Callable[[Build[P]], RuleOutput]
    differences: str = ""  # how trainprof's verdict differs from the original
    patience_auto: str = "for"  # what patience_mode=auto means for this rule
    version: int = 1  # bump when the rule's semantics change
    alerting: bool = True  # False for the summary rules (recordings only)
    family: str = ""  # one of FAMILIES
    # Families or rule names whose alerts for the same job this rule's firing alert makes
    # noise (they follow from it): Alertmanager inhibits them while it fires.
    inhibits: tuple[str, ...] = ()
    # What the rule's dashboard row and report section draw: (build, its output, where it
    # is drawn, every rule's recordings) -> signals. Every alerting rule has them.
    signals: Callable[[Build[P], RuleOutput, Selects, Recordings], tuple[Signal, ...]] | None = None
    # What the exporters / the training API must count for it: input (one of INPUTS) -> value.
    inputs: Callable[[Build[P]], Mapping[str, Any]] | None = None
    # Alerts saying the exporters do not serve this rule's inputs (group trainprof.health).
    health: Callable[[Build[P]], tuple[HealthCheck, ...]] | None = None
    # Job-state alerts the rule brings (group trainprof.state, rule label TrainprofState).
    state: Callable[[Build[P]], tuple[StateAlert, ...]] | None = None
    # False for rules that read only the training API: without any rule reading the
    # exporters, the health group's sampler-interval check is left out.
    reads_exporter: bool = True
    # Problems of a combination of parameter values, as (parameter, message) pairs: the
    # configuration loader reports them with the other problems, each with its path.
    check: Callable[[P], tuple[tuple[str, str], ...]] | None = None
    # The parameter saying below which utilization a GPU counts as idle; the fleet
    # dashboard's idle GPU-hours use the first configured rule that has one.
    gpu_idle_param: str = ""
    # What the rule counts as its datapoints (replay's and the report's "datapoints
    # analysed"): "samples" (the exporter's), "steps", or "ranks" (processes that started);
    # none of them means the rule had no data.
    datapoints: str = "samples"
    # A rule comparing GPUs within a node does not apply to a node with fewer.
    min_gpus_per_node: int = 0
    # False for a rule ProfilerReport does not stand for: configured as a rule of its own.
    profiler_report: bool = True
    # The `source` settings it can read its GPU signals from (trainprof.sources); with any
    # other the compiler leaves it out and says so.
    gpu_sources: tuple[str, ...] = ("trainprof", "dcgm")

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(
                f"rule {self.name}: severity {self.severity!r} is not one of "
                f"{', '.join(SEVERITIES)}"
            )
        if self.family and self.family not in FAMILIES:
            raise ValueError(
                f"rule {self.name}: family {self.family!r} is not one of {', '.join(FAMILIES)}"
            )
        if self.datapoints not in ("samples", "steps", "ranks"):
            raise ValueError(f"rule {self.name}: datapoints must be samples, steps or ranks")
        if self.patience_auto not in ("for", "warmup"):
            raise ValueError(f"rule {self.name}: patience_auto must be for or warmup")
        if self.alerting and self.signals is None:
            raise ValueError(
                f"rule {self.name}: an alerting rule says what its dashboard row draws (signals=)"
            )
        params_of(self.parameters)  # a TypeError names a field not made by param()
        if self.gpu_idle_param:
            self.param(self.gpu_idle_param)  # a KeyError names a parameter it does not have

    @property
    def params(self) -> tuple[Param, ...]:
        return params_of(self.parameters)

    def values(self, values: Mapping[str, Any]) -> P:
        """The typed parameters of resolved values (every parameter present)."""
        return self.parameters(**values)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}


@dataclasses.dataclass
class Build(Generic[P]):
    """Everything a catalog entry needs to write its PromQL: `p` holds the rule's typed
    parameters (its `RuleSpec.parameters` dataclass), the rest the deployment."""

    rule: RuleSpec[P]
    p: P
    datapoint_interval: float
    scrape_interval: float
    patience_mode: str  # for | warmup (auto already resolved)
    job_labels: tuple[str, ...]
    matchers: tuple[promql.Matcher, ...]
    where: str  # config path template of a parameter, {param}
    warnings: list[str]
    given: frozenset[str] = frozenset()  # parameters the configuration set
    # Sampled histograms whose signal a source adapter serves instead, as the per-job gauge
    # recorded at each scrape (trainprof.sources.gauges); empty with trainprof's exporter.
    gauges: Mapping[str, str] = dataclasses.field(default_factory=dict)
    gpu_source: str = "trainprof"  # trainprof | dcgm
    host_source: str = "trainprof"  # trainprof | node_exporter
    # The longest patience `patience()` applied, in seconds (`for:` or warm-up alike): how
    # long a firing alert of the rule holds through noise (Alert.hold).
    patience_seconds: float = 0.0

    def path(self, param: str) -> str:
        return self.where.format(param=param)

    # --- selectors ---------------------------------------------------------------------

    def sel(self, series: str, **equal: str) -> str:
        """A selector of a contract series (`_bucket`/`_sum`/`_count` allowed) with the
        job selector applied."""
        if series in self.gauges.values():
            return promql.selector(series, self.matchers, **equal)
        base = re.sub(r"_(bucket|sum|count)$", "", series)
        known = contract.BY_NAME.get(series) or contract.BY_NAME.get(base)
        if known is None or series not in contract.series_names(known):
            raise KeyError(
                f"rule {self.rule.name} selects {series}, which is not in the metric contract"
            )
        return promql.selector(series, self.matchers, **equal)

    def gauge(self, histogram: str) -> str | None:
        """The selector of the per-scrape gauge a source adapter serves `histogram`'s signal
        as, or None when trainprof's exporter serves the histogram itself."""
        name = self.gauges.get(histogram)
        return promql.selector(name, self.matchers) if name else None

    def over_time(self, histogram: str, over_time: Callable[[str], str]) -> str:
        """`over_time(selector)` of the per-job gauge a source adapter serves `histogram`'s
        signal as (a function of a series' samples over a range that scales with them:
        `quantile_over_time`, `avg_over_time`), on the source's own samples where the gauge
        is not recorded at every scrape (`trainprof.sources.gauges.from_samples`)."""
        from trainprof.sources.gauges import from_samples

        return from_samples(self.gauges[histogram], over_time, self.job_labels, self.matchers)

    def seen(self, histogram: str, datapoints: int) -> str:
        """What `patience`'s warm-up guard compares with `datapoints`: the samples of
        `histogram` so far (its `_count`), or for a gauge its scrapes over the last
        `datapoints` datapoints and one scrape more, counted in datapoints, which exceeds
        `datapoints` once the signal covers that long."""
        from trainprof.sources.gauges import SCRAPES_OF

        name = self.gauges.get(histogram)
        if name is None:
            return self.sel(histogram + "_count")
        gauge = promql.selector(SCRAPES_OF.get(name, name), self.matchers)
        span = format_duration(datapoints * self.datapoint_interval + self.scrape_interval)
        per_scrape = self.scrape_interval / self.datapoint_interval
        return f"count_over_time({gauge}[{span}]) * {per_scrape:g}"

    @property
    def by_job(self) -> str:
        return promql.by(self.job_labels)

    @property
    def on_job(self) -> str:
        return f"on ({', '.join(self.job_labels)})"

    # --- time ----------------------------------------------------------------------------

    def span(self, datapoints: int, param: str) -> str:
        """The range a window of `datapoints` samples lasts, at least two scrape intervals.

        Shorter ranges hold fewer than two scrapes, so rate() would return nothing and the
        rule could never fire: raise them, and say so when the configuration set `param`
        (a default raised this way is documented with its rule instead).
        """
        seconds = datapoints * self.datapoint_interval
        minimum = 2 * self.scrape_interval
        if seconds < minimum and param in self.given:
            self.warnings.append(
                f"{self.path(param)}: {self.rule.name}'s {param} of {datapoints} datapoints "
                f"x {self.datapoint_interval:g}s "
                f"= {format_duration(seconds)} is shorter than two scrape intervals; "
                f"using {format_duration(minimum)} so the range holds at least two scrapes"
            )
        return format_duration(max(seconds, minimum))

    def patience(
        self, expr: str, datapoints: int, count: str, matching: str = ""
    ) -> tuple[str, float]:
        """Apply SageMaker's patience: `for:` of N datapoints, or a warm-up guard.

        The guard keeps `expr` only where `count` (the datapoints seen so far) exceeds N;
        `matching` is the `and` operator's `on (...)` / `ignoring (...)` clause.
        """
        self.patience_seconds = max(self.patience_seconds, datapoints * self.datapoint_interval)
        if self.patience_mode == "for":
            return expr, datapoints * self.datapoint_interval
        op = f"and {matching}" if matching else "and"
        return f"(\n{indent(expr)}\n)\n{op}\n{count} > {datapoints}", 0.0


def indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line if line else line for line in text.splitlines())


def ratio(percent: float) -> str:
    """A percentage as the ratio literal PromQL compares with: 70 -> "0.7"."""
    return contract.threshold_label(percent / 100)

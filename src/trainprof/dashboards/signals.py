"""What each rule watches, as queries with the threshold it compares them with.

Built from the rule's catalog entry and its configured parameters: a recording's name comes
from the rule's own build (the `Recording` it writes), a threshold from the parameter the
alert compares with, converted the way the alert converts it. Changing
`LowGPUUtilization.threshold_p95` therefore moves the alert, the dashboard's threshold line
and the report's together.

    >>> config = default_config()
    >>> [s.threshold.text for s in rule_signals(config, config.rule("LowGPUUtilization"),
    ...                                         Scope(config, ()))]
    ['threshold_p95 = 70%', 'threshold_p5 = 10%']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from trainprof import metrics as contract
from trainprof.dashboards.queries import Scope
from trainprof.rules.config import RuleInstance, RulesConfig, default_config  # noqa: F401
from trainprof.rules.model import Build, Recording, RuleOutput, Values

RATIO_UNIT, SECONDS_UNIT, NUMBER_UNIT = "percentunit", "s", "none"


@dataclasses.dataclass(frozen=True)
class Threshold:
    value: float  # in the signal's unit
    text: str  # the parameter and its configured value: "threshold_p95 = 70%"
    fires: str  # above | below: on which side of the line the rule fires


@dataclasses.dataclass(frozen=True)
class Signal:
    title: str
    expr: str  # PromQL, narrowed by the scope's variables
    legend: str  # Grafana legend format: "{{node}} GPU {{gpu}}"
    unit: str  # Grafana unit id
    threshold: Threshold


def build(config: RulesConfig, instance: RuleInstance) -> tuple[Build, RuleOutput]:
    """The rule's own build, as the compiler runs it."""
    b = Build(
        rule=instance.spec,
        p=Values(instance.values),
        datapoint_interval=config.datapoint_interval,
        scrape_interval=config.scrape_interval,
        patience_mode=instance.patience_mode,
        job_labels=config.job_labels,
        matchers=config.job_selector,
        where=instance.where,
        warnings=[],
    )
    return b, instance.spec.build(b)


def recording(
    output: RuleOutput, metric: str, level: str | None = None, **labels: str
) -> Recording:
    """The rule's recording of `metric` (the middle part of its name), at `level` if given."""
    for rec in output.recordings:
        rec_level, rec_metric, _ = rec.record.split(":")
        if (
            rec_metric == metric
            and level in (None, rec_level)
            and all(rec.labels.get(k) == v for k, v in labels.items())
        ):
            return rec
    names = ", ".join(r.record for r in output.recordings) or "none"
    raise KeyError(f"no recording of {metric} {labels or ''} (the rule records: {names})")


def evaluation_interval(instance: RuleInstance) -> float:
    """Seconds between two evaluations of the rule's group."""
    return instance.values["scan_interval_us"] / 1e6


def _percent(param: str, value: float, fires: str) -> Threshold:
    return Threshold(value / 100, f"{param} = {value:g}%", fires)


_GPU_LEGEND = "{{node}} GPU {{gpu}}"
_UTIL = "trainprof_gpu_utilization_sampled_ratio"
_MEMORY = "trainprof_gpu_memory_used_sampled_ratio"
_CPU = "trainprof_cpu_utilization_sampled_ratio"


def _bottleneck(counter: str, busy_param: str, busy_text: str):
    def signals(b: Build, out: RuleOutput, scope: Scope, config: RulesConfig):
        p = b.p
        busy_label, gpu_label = contract.metric(counter).labels
        rec = out.recordings[0]
        grid = {
            busy_label: contract.threshold_label(getattr(p, busy_param) / 100),
            gpu_label: contract.threshold_label(p.gpu_threshold / 100),
        }
        return (
            Signal(
                f"Samples with {busy_text} above {getattr(p, busy_param):g}% while a GPU is "
                f"below {p.gpu_threshold:g}%",
                scope.sel(rec.record, **grid),
                "{{training_job}}",
                RATIO_UNIT,
                _percent("threshold", p.threshold, "above"),
            ),
        )

    return signals


def _quantile(scope: Scope, histogram: str, q: float, span: str) -> str:
    """The q-quantile over `span` of the panel's selection, computed when the panel loads:
    the rules decide on the share of samples below the threshold (cheap at fleet scale),
    the dashboard shows the percentile itself for the few series on screen."""
    return f"histogram_quantile({q:g}, rate({scope.sel(histogram + '_bucket')}[{span}]))"


def _low_gpu(b, out, scope, config):
    p = b.p
    span = b.span(p.window, "window")
    return (
        Signal(
            f"95th percentile GPU utilization over {span}",
            _quantile(scope, _UTIL, 0.95, span),
            _GPU_LEGEND,
            RATIO_UNIT,
            _percent("threshold_p95", p.threshold_p95, "below"),
        ),
        Signal(
            f"5th percentile GPU utilization over {span}",
            _quantile(scope, _UTIL, 0.05, span),
            _GPU_LEGEND,
            RATIO_UNIT,
            _percent("threshold_p5", p.threshold_p5, "below"),
        ),
    )


def _batch_size(b, out, scope, config):
    p = b.p
    span = b.span(p.window, "window")
    return tuple(
        Signal(
            f"95th percentile {what} over {span}",
            _quantile(scope, metric, 0.95, span),
            legend,
            RATIO_UNIT,
            _percent(param, getattr(p, param), "below"),
        )
        for what, metric, param, legend in (
            ("GPU utilization", _UTIL, "gpu_threshold_p95", _GPU_LEGEND),
            ("GPU memory", _MEMORY, "gpu_memory_threshold_p95", _GPU_LEGEND),
            ("CPU utilization (average of the cores)", _CPU, "cpu_threshold_p95", "{{node}}"),
        )
    )


def _memory_increase(b, out, scope, config):
    p = b.p
    span = b.span(p.window, "window")
    total, count = scope.sel(_MEMORY + "_sum"), scope.sel(_MEMORY + "_count")
    mean = f"rate({total}[{span}]) / rate({count}[{span}])"
    before = f"rate({total}[{span}] offset {span}) / rate({count}[{span}] offset {span})"
    return (
        Signal(
            f"Mean GPU memory over the last {span} minus the mean over the {span} before",
            f"{mean}\n-\n{before}",
            _GPU_LEGEND,
            RATIO_UNIT,
            _percent("increase", p.increase, "above"),
        ),
    )


def _load_balancing(b, out, scope, config):
    p = b.p
    return (
        Signal(
            "Jensen-Shannon distance between the utilization of two GPUs",
            scope.sel("trainprof_gpu_utilization_js_distance"),
            "{{node}} GPU {{gpu}} vs {{peer_gpu}}",
            NUMBER_UNIT,
            Threshold(p.threshold, f"threshold = {p.threshold:g}", "above"),
        ),
    )


def _max_initialization(b, out, scope, config):
    p = b.p
    framework = config.rule("OverallFrameworkMetrics")
    if framework is None:
        raise ValueError(
            "the MaxInitializationTime panel reads OverallFrameworkMetrics' "
            "recordings; configure ProfilerReport or OverallFrameworkMetrics"
        )
    initialization = recording(
        build(config, framework)[1], "trainprof_training_initialization_seconds"
    )
    jl = ", ".join(config.job_labels)
    age = f"max {scope.by_job} (time() - {scope.sel('trainprof_training_start_timestamp_seconds')})"
    stepped = f"sum {scope.by_job} ({scope.sel('trainprof_training_steps_total')}) > 0"
    return (
        Signal(
            "Time from start to the first step (time since start while there is none)",
            f"{scope.sel(initialization.record)}\nor\n({age}\nunless on ({jl})\n{stepped})",
            "{{training_job}}",
            SECONDS_UNIT,
            Threshold(p.threshold * 60, f"threshold = {p.threshold:g} min", "above"),
        ),
    )


def _step_outlier(b, out, scope, config):
    p = b.p
    equal = {"stddev": contract.threshold_label(p.stddev)}
    if p.mode:
        equal["mode"] = p.mode
    return (
        Signal(
            f"Steps slower than the mean + {p.stddev:g} standard deviations",
            scope.sel("trainprof_training_step_outliers_total", **equal),
            "rank {{rank}} {{mode}}",
            NUMBER_UNIT,
            Threshold(p.n_outliers, f"n_outliers = {p.n_outliers}", "above"),
        ),
    )


_SIGNALS: dict[str, Callable] = {
    "CPUBottleneck": _bottleneck(
        "trainprof_cpu_bottleneck_samples_total", "cpu_threshold", "a CPU core"
    ),
    "IOBottleneck": _bottleneck(
        "trainprof_io_bottleneck_samples_total", "io_threshold", "a core's I/O wait"
    ),
    "LowGPUUtilization": _low_gpu,
    "BatchSize": _batch_size,
    "GPUMemoryIncrease": _memory_increase,
    "LoadBalancing": _load_balancing,
    "MaxInitializationTime": _max_initialization,
    "StepOutlier": _step_outlier,
}


def rule_signals(config: RulesConfig, instance: RuleInstance, scope: Scope) -> tuple[Signal, ...]:
    """The signals of one alerting rule; a KeyError for a rule nobody described here."""
    try:
        make = _SIGNALS[instance.spec.name]
    except KeyError:
        raise KeyError(
            f"rule {instance.spec.name} has no signal in dashboards/signals.py; "
            "say which series its dashboard row shows"
        ) from None
    b, out = build(config, instance)
    return make(b, out, scope, config)


def alerting(config: RulesConfig) -> tuple[RuleInstance, ...]:
    return tuple(i for i in config.rules if i.spec.alerting)


def summary_recordings(config: RulesConfig, rule: str) -> RuleOutput:
    """The recordings of a summary rule (OverallSystemUsage, OverallFrameworkMetrics),
    which the report sections and their dashboard rows read."""
    instance = config.rule(rule)
    if instance is None:
        raise ValueError(
            f"the dashboards read {rule}'s recordings; configure ProfilerReport or {rule}"
        )
    return build(config, instance)[1]

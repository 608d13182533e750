"""The report's queries: the job dashboard's, with the dashboard variables set to one job.

>>> qs = report_queries(compile_rules(default_config()))
>>> qs["system.gpu"].over_time, qs["system.p95"].over_time
(True, False)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from trainprof.contract import metrics as contract
from trainprof.contract.durations import format_duration
from trainprof.dashboards import exprs as x
from trainprof.dashboards.alerts import state_now
from trainprof.dashboards.queries import JOB_VARIABLES, RANGE, Scope, interpolate, one_job
from trainprof.report import usage
from trainprof.rules.compiler import Compiled, MissingRecording, compile_rules  # noqa: F401
from trainprof.rules.config import RuleInstance, default_config  # noqa: F401
from trainprof.rules.model import Signal


@dataclasses.dataclass(frozen=True)
class ReportQuery:
    expr: str  # PromQL with the dashboard's variables
    over_time: bool = False  # a range query, else one value at the end
    legend: str = ""  # Grafana legend format


def signals(compiled: Compiled, instance: RuleInstance, scope: Scope) -> tuple[Signal, ...]:
    """The rule's signals; none when they read a summary rule the configuration leaves out."""
    try:
        return compiled.signals(instance, scope)
    except MissingRecording:
        return ()


def report_queries(compiled: Compiled) -> dict[str, ReportQuery]:
    """Every query of the report. Those reading OverallSystemUsage's or
    OverallFrameworkMetrics' recordings are left out when the configuration leaves the rule
    out: nothing records them then."""
    config = compiled.config
    scope = Scope(config, JOB_VARIABLES)
    q: dict[str, ReportQuery] = {
        "summary.start": ReportQuery(x.start_ms(scope)),
        "summary.elapsed": ReportQuery(x.elapsed(scope)),
        "summary.steps": ReportQuery(x.steps_by_mode(scope), legend="{{mode}}"),
        "summary.step_rate": ReportQuery(x.step_rate(scope, over=RANGE)),
        "summary.nodes": ReportQuery(x.node_count(scope)),
        "summary.gpus": ReportQuery(x.gpu_count(scope)),
        "summary.ranks": ReportQuery(x.rank_count(scope)),
        "summary.step_rate_per_rank": ReportQuery(
            x.step_rate(scope, by="rank"), True, "rank {{rank}}"
        ),
        "system.cpu": ReportQuery(
            x.mean(scope, contract.CPU_UTILIZATION_SAMPLED_RATIO), True, "{{node}}"
        ),
        "system.iowait": ReportQuery(
            x.mean(scope, contract.CPU_IOWAIT_SAMPLED_RATIO), True, "{{node}}"
        ),
        "system.memory": ReportQuery(
            x.mean(scope, contract.MEMORY_USED_SAMPLED_RATIO), True, "{{node}}"
        ),
        "system.gpu": ReportQuery(
            x.mean(scope, contract.GPU_UTILIZATION_SAMPLED_RATIO), True, x.GPU_LEGEND
        ),
        "system.gpu_memory": ReportQuery(
            x.mean(scope, contract.GPU_MEMORY_USED_SAMPLED_RATIO), True, x.GPU_LEGEND
        ),
        "system.gpu_busy": ReportQuery(x.gpu_busy_seconds(scope), legend=x.GPU_LEGEND),
        "system.cpu_busy": ReportQuery(x.cpu_busy_seconds(scope), legend="{{node}}"),
        "framework.step_buckets": ReportQuery(x.step_buckets(scope, RANGE)),
        "framework.dataloader": ReportQuery(x.dataloader_share(scope), True, "rank {{rank}}"),
        "framework.phase_seconds": ReportQuery(x.phase_seconds(scope), legend="{{phase}}"),
        "framework.phase_per_step": ReportQuery(
            x.phase_seconds_per_step(scope), legend="{{phase}}"
        ),
        "rules.firing": ReportQuery(
            f"count by (rule) ({x.firing_alerts(scope)})", True, "{{rule}}"
        ),
        "rules.state": ReportQuery(state_now(scope, compiled.alerting), legend="{{rule}}"),
    }
    for name, expr in usage.queries(scope).items():
        q[name] = ReportQuery(expr)
    # Recordings of the summary rules: each block all or none, none when the configuration
    # leaves out the rule that records them.
    try:
        system = {}
        for direction in ("receive", "transmit"):
            system[f"system.network_{direction}"] = ReportQuery(
                x.network(scope, compiled, direction), True, f"{{{{node}}}} {direction}"
            )
        for quantile in x.QUANTILES:
            system[f"system.p{float(quantile) * 100:g}"] = ReportQuery(
                x.system_usage_quantile(scope, compiled, quantile)
            )
        q.update(system)
    except MissingRecording:
        pass
    try:
        q.update(
            {
                "summary.initialization": ReportQuery(x.initialization(scope, compiled)),
                "framework.phases": ReportQuery(
                    x.job_phase_share(scope, compiled), legend="{{phase}}"
                ),
                "framework.modes": ReportQuery(
                    x.job_mode_share(scope, compiled), legend="{{mode}}"
                ),
            }
        )
    except MissingRecording:
        pass
    for quantile in x.STEP_QUANTILES:
        q[f"framework.step_p{float(quantile) * 100:g}"] = ReportQuery(
            x.step_quantile(scope, quantile), True, "{{mode}}"
        )
    for instance in compiled.alerting:
        for i, signal in enumerate(signals(compiled, instance, scope)):
            q[f"rule.{instance.spec.name}.{i}"] = ReportQuery(signal.expr, True, signal.legend)
    return q


def grafana_builtins(seconds: float, step: float, scrape_interval: float) -> dict[str, str]:
    """Grafana's interval variables for a report over `seconds` with points `step` apart:
    $__rate_interval is at least four scrapes, as Grafana makes it."""
    return {
        "__range": format_duration(max(seconds, 1)),
        "__interval": format_duration(step),
        "__rate_interval": format_duration(max(step + scrape_interval, 4 * scrape_interval)),
    }


def resolved(
    compiled: Compiled,
    training_job: str,
    namespace: str | None,
    seconds: float,
    step: float,
    extra: Mapping[str, ReportQuery] | None = None,
) -> dict[str, ReportQuery]:
    """The report's queries for one job, and `extra` ones in the same dashboard variables
    (the compare report's), variables replaced."""
    values = one_job(training_job, namespace)
    builtins = grafana_builtins(seconds, step, compiled.config.scrape_interval)
    return {
        name: dataclasses.replace(rq, expr=interpolate(rq.expr, values, builtins))
        for name, rq in {**report_queries(compiled), **(extra or {})}.items()
    }

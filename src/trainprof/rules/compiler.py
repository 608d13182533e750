"""Compile a resolved configuration into Prometheus rule groups.

One group per rule, named `trainprof.<Rule>`, evaluated every `scan_interval_us`: its
recording rules first, then its alerts, so an alert reads recordings of the same evaluation.
A recording several rules need is written once, in the first group that needs it. A last group,
`trainprof.health`, alerts when the exporters do not serve what the rules were compiled for.

Every alert carries `rule`, `severity` and `trainprof_rule_version`, and the annotations
summary, description (with the measured value), recommendation, runbook_url and dashboard_url.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from trainprof.durations import format_duration
from trainprof.rules.config import RuleInstance, RulesConfig
from trainprof.rules.model import Alert, Build, Recording, Values, ratio

ALERT_PREFIX = "Training"
JOB_DASHBOARD_UID = "trainprof-job"
HEALTH_RULE = "TrainprofHealth"
# A job's state rather than a verdict: alerts with this `rule` label exist for Alertmanager
# to inhibit on (a job that has not started is not bottlenecked yet); no one acts on them.
STATE_RULE = "TrainprofState"


@dataclasses.dataclass(frozen=True)
class Compiled:
    groups: list[dict[str, Any]]
    warnings: tuple[str, ...]


def alert_name(rule: str) -> str:
    return ALERT_PREFIX + rule


def compile_rules(config: RulesConfig) -> Compiled:
    warnings = list(config.warnings)
    groups, seen = [], {}
    for instance in config.rules:
        build = _build_context(config, instance, warnings)
        output = instance.spec.build(build)
        rules, elsewhere = [], {}
        for rec in output.recordings:
            key = (rec.record, tuple(sorted(rec.labels.items())))
            if key in seen:
                if seen[key] != rec.expr:
                    raise AssertionError(f"recording {rec.record} built twice, differently")
                elsewhere[rec.record] = rec.expr
                continue
            seen[key] = rec.expr
            rules.append(_recording(rec))
        for alert in output.alerts:
            # Groups are evaluated independently, so reading another group's recording
            # could lag one interval behind: spell its expression out instead.
            alert = dataclasses.replace(alert, expr=_inline(alert.expr, elsewhere))
            rules.append(_alert(config, instance, alert))
        groups.append(
            {
                "name": f"trainprof.{instance.spec.name}",
                "interval": format_duration(instance.values["scan_interval_us"] / 1e6),
                "rules": rules,
            }
        )
    state = _state_rules(config)
    if state:
        fastest = min(i.values["scan_interval_us"] for i in config.rules) / 1e6
        groups.append(
            {"name": "trainprof.state", "interval": format_duration(fastest), "rules": state}
        )
    health = _health_rules(config)
    if health:
        groups.append({"name": "trainprof.health", "interval": "1m", "rules": health})
    return Compiled(groups, tuple(warnings))


def _state_rules(config: RulesConfig) -> list[dict[str, Any]]:
    """`TrainingNotStarted`: from a job's first training process until its first step.

    Fires at once (no `for:`), so Alertmanager can hold back the host and GPU verdicts of a
    job that is still loading: they describe initialization, which MaxInitializationTime
    judges. Only compiled with MaxInitializationTime, whose inputs it reads.
    """
    if config.rule("MaxInitializationTime") is None:
        return []
    from trainprof.rules.promql import by, selector

    jl = config.job_labels
    start = selector("trainprof_training_start_timestamp_seconds", config.job_selector)
    steps = selector("trainprof_training_steps_total", config.job_selector)
    return [
        {
            "alert": "TrainingNotStarted",
            "expr": (
                f"max {by(jl)} (time() - {start})\nunless on ({', '.join(jl)})\n"
                f"sum {by(jl)} ({steps}) > 0"
            ),
            "labels": {"rule": STATE_RULE, "severity": "info", "trainprof_rule_version": "1"},
            "annotations": {
                "summary": "A training job has not completed its first step yet.",
                "description": (
                    "Job {{ $labels.training_job }} started {{ $value | "
                    "humanizeDuration }} ago and is still initializing; its host "
                    "and GPU alerts are held back until its first step."
                ),
            },
        }
    ]


def _inline(expr: str, recordings: dict[str, str]) -> str:
    for name, body in recordings.items():
        pattern = re.compile(rf"(?<![\w:]){re.escape(name)}(?![\w:{{])")
        expr = pattern.sub(lambda _, body=body: f"({body})", expr)
    return expr


def _build_context(config: RulesConfig, instance: RuleInstance, warnings: list) -> Build:
    return Build(
        rule=instance.spec,
        p=Values(instance.values),
        datapoint_interval=config.datapoint_interval,
        scrape_interval=config.scrape_interval,
        patience_mode=instance.patience_mode,
        job_labels=config.job_labels,
        matchers=config.job_selector,
        where=instance.where,
        warnings=warnings,
    )


def _recording(rec: Recording) -> dict[str, Any]:
    out: dict[str, Any] = {"record": rec.record, "expr": rec.expr}
    if rec.labels:
        out["labels"] = dict(rec.labels)
    return out


def _alert(config: RulesConfig, instance: RuleInstance, alert: Alert) -> dict[str, Any]:
    spec = instance.spec
    anchor = spec.name.lower()
    dashboard = (
        f"{config.grafana_url}/d/{JOB_DASHBOARD_UID}/trainprof-job"
        "?var-training_job={{ $labels.training_job | urlquery }}"
        "&var-namespace={{ $labels.namespace | urlquery }}"
    )
    out: dict[str, Any] = {"alert": alert_name(spec.name), "expr": alert.expr}
    if alert.for_seconds:
        out["for"] = format_duration(alert.for_seconds)
    out["labels"] = {
        "rule": spec.name,
        "severity": instance.severity,
        "trainprof_rule_version": str(spec.version),
        **alert.labels,
    }
    out["annotations"] = {
        "summary": alert.summary,
        "description": alert.description,
        "recommendation": spec.recommendation,
        "runbook_url": f"{config.runbook_url}#{anchor}",
        "dashboard_url": dashboard,
    }
    return out


def _health_rules(config: RulesConfig) -> list[dict[str, Any]]:
    """Alerts that say the rules are blind: the exporters sample at another interval than
    the rules were compiled for, or do not count the thresholds a rule selects."""
    uses_exporter = any(
        i.spec.name not in ("MaxInitializationTime", "StepOutlier", "OverallFrameworkMetrics")
        for i in config.rules
    )
    if not uses_exporter:
        return []
    from trainprof.rules.promql import selector

    jl = ", ".join(config.job_labels)
    interval = selector("trainprof_sampler_interval_seconds", config.job_selector)
    samples = selector("trainprof_samples_total", config.job_selector)
    rules = [
        _health_alert(
            "TrainprofSamplerIntervalMismatch",
            f"{interval} != {config.datapoint_interval:g}",
            summary="An exporter samples at another interval than the rules assume.",
            description=(
                "The exporter {{ $labels.instance }} samples every {{ $value }}s, but the rules "
                f"were compiled for a datapoint interval of {config.datapoint_interval:g}s: "
                "windows and patience are off by the same factor. Restart the exporter with "
                f"--datapoint-interval {config.datapoint_interval:g}s or recompile the rules."
            ),
            affects="all",
        )
    ]
    for name, counter, busy_label, busy_param in (
        ("CPUBottleneck", "trainprof_cpu_bottleneck_samples_total", "cpu_above", "cpu_threshold"),
        ("IOBottleneck", "trainprof_io_bottleneck_samples_total", "iowait_above", "io_threshold"),
    ):
        instance = config.rule(name)
        if instance is None:
            continue
        grid = {
            busy_label: ratio(instance.values[busy_param]),
            "gpu_below": ratio(instance.values["gpu_threshold"]),
        }
        served = selector(counter, config.job_selector, **grid)
        rules.append(
            _health_alert(
                "TrainprofRuleInputMissing",
                f"count by ({jl}) ({samples})\nunless on ({jl})\ncount by ({jl}) ({served})",
                summary="Exporters do not serve a series a rule needs.",
                description=(
                    f"The exporters of job {{{{ $labels.training_job }}}} do not count "
                    f'{counter}{{{busy_label}="{grid[busy_label]}", gpu_below='
                    f'"{grid["gpu_below"]}"}}, so {name} cannot fire. Start them with '
                    "--rules.config set to the rule configuration."
                ),
                affects=name,
            )
        )
    return rules


def _health_alert(
    name: str, expr: str, summary: str, description: str, affects: str
) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": "5m",
        "labels": {
            "rule": HEALTH_RULE,
            "severity": "warning",
            "affects": affects,
            "trainprof_rule_version": "1",
        },
        "annotations": {"summary": summary, "description": description},
    }


def required_inputs(config: RulesConfig) -> dict[str, Any]:
    """Thresholds the exporters and the training API must count for these rules.

    `trainprof exporter --rules.config` and `trainprof.start(rules_config=...)` read this.
    """
    cpu, io, stddevs = [], [], []
    for instance in config.rules:
        v = instance.values
        if instance.spec.name == "CPUBottleneck":
            cpu.append((v["cpu_threshold"] / 100, v["gpu_threshold"] / 100))
        elif instance.spec.name == "IOBottleneck":
            io.append((v["io_threshold"] / 100, v["gpu_threshold"] / 100))
        elif instance.spec.name == "StepOutlier":
            stddevs.append(float(v["stddev"]))
    return {
        "cpu_bottleneck": cpu,
        "io_bottleneck": io,
        "step_outlier_stddevs": stddevs,
        "datapoint_interval": config.datapoint_interval,
    }

"""Compile a resolved configuration, once, into Prometheus rule groups and everything that
reads them.

One group per rule, named `trainprof.<Rule>`, evaluated every `scan_interval_us`: its
recording rules first, then its alerts, so an alert reads recordings of the same evaluation.
A recording several rules need is written once, in the first group that needs it. The group
`trainprof.state` holds the job-state alerts rules bring (`RuleSpec.state`); a last group,
`trainprof.health`, alerts when the exporters do not serve what the rules were compiled for
(`RuleSpec.health`).

Every alert carries `rule`, `severity` and `trainprof_rule_version`, and the annotations
summary, description (with the measured value), recommendation, runbook_url and dashboard_url.

The `Compiled` result indexes every rule's recordings by (rule, metric, level) and draws each
rule's signals: the dashboards, the report, alerting, replay and the docs read it.

    >>> compiled = compile_rules(default_config())
    >>> compiled.recording("trainprof_training_initialization_seconds", level="training_job").record
    'training_job:trainprof_training_initialization_seconds:min'
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from trainprof import sources
from trainprof.contract import metrics as contract
from trainprof.contract.durations import format_duration
from trainprof.contract.names import (
    HEALTH_GROUP,
    HEALTH_RULE,
    INPUT_MISSING_ALERT,
    JOB_DASHBOARD,
    STATE_GROUP,
    STATE_RULE,
    VERSION_LABEL,
    alert_name,
    group_name,
)
from trainprof.rules import attribution
from trainprof.rules.config import RuleInstance, RulesConfig, default_config  # noqa: F401
from trainprof.rules.job_alerts import Affected, default_hold, health_metric
from trainprof.rules.model import (
    INPUTS,
    Alert,
    Build,
    HealthCheck,
    Population,
    Recording,
    RuleOutput,
    Selects,
    Signal,
    Units,
)
from trainprof.sources.gauges import gauges_for

# Kept importable from here: older code and tests name them through the compiler.
__all__ = ["HEALTH_RULE", "STATE_RULE", "alert_name", "compile_rules", "required_inputs"]
JOB_DASHBOARD_UID = JOB_DASHBOARD.uid


class MissingRecording(ValueError):
    """A query reads a recording no rule of the configuration writes."""


@dataclasses.dataclass(frozen=True)
class CompiledRule:
    """One configured rule: its build context, what it built and its group."""

    instance: RuleInstance
    build: Build
    output: RuleOutput
    group: dict[str, Any]

    @property
    def name(self) -> str:
        return self.instance.spec.name


@dataclasses.dataclass(frozen=True)
class Compiled:
    groups: list[dict[str, Any]]
    warnings: tuple[str, ...]
    config: RulesConfig
    rules: tuple[CompiledRule, ...]
    # Each alert's recording of what it found (trainprof.rules.job_alerts): the rules', then
    # the health checks' (rule TrainprofHealth).
    affected: tuple[Affected, ...] = ()

    def affected_of(self, name: str) -> tuple[Affected, ...]:
        """The `affected` recordings of rule `name`'s alerts, one per alert (reason)."""
        return tuple(a for a in self.affected if a.rule == name)

    def rule(self, name: str) -> CompiledRule | None:
        return next((r for r in self.rules if r.name == name), None)

    @property
    def alerting(self) -> tuple[RuleInstance, ...]:
        """The configured alerting rules, in report order."""
        return tuple(r.instance for r in self.rules if r.instance.spec.alerting)

    def recordings(
        self,
        metric: str,
        level: str | None = None,
        operation: str | None = None,
        rule: str | None = None,
        **labels: str,
    ) -> list[Recording]:
        """Every distinct recording of `metric`, narrowed by level, operation, rule and
        labels."""
        found: dict[tuple, Recording] = {}
        for compiled in self.rules:
            if rule not in (None, compiled.name):
                continue
            for rec in compiled.output.recordings:
                if (
                    rec.metric == metric
                    and level in (None, rec.level)
                    and operation in (None, rec.operation)
                    and all(rec.labels.get(k) == v for k, v in labels.items())
                ):
                    found.setdefault((rec.record, tuple(sorted(rec.labels.items()))), rec)
        return list(found.values())

    def recording(
        self,
        metric: str,
        level: str | None = None,
        operation: str | None = None,
        rule: str | None = None,
        **labels: str,
    ) -> Recording:
        """The one recording of `metric` so narrowed; MissingRecording when no configured
        rule writes it."""
        found = self.recordings(metric, level, operation, rule, **labels)
        what = f"{metric} at level {level or 'any'}" + (f" {labels}" if labels else "")
        if not found:
            raise MissingRecording(
                f"no configured rule records {what}; configure ProfilerReport or the rule "
                "that records it (see docs/rules.md)"
            )
        if len(found) > 1:
            names = ", ".join(r.record for r in found)
            raise LookupError(f"several recordings of {what}: {names}; say which")
        return found[0]

    def signals(self, instance: RuleInstance | str, scope: Selects) -> tuple[Signal, ...]:
        """What the rule's dashboard row and report section draw, narrowed by `scope`.

        Raises MissingRecording when they read a summary rule the configuration leaves out.
        """
        name = instance if isinstance(instance, str) else instance.spec.name
        compiled = self.rule(name)
        if compiled is None:
            raise KeyError(f"rule {name} is not configured")
        make = compiled.instance.spec.signals
        if make is None:
            raise KeyError(f"rule {name} has no signals in its catalog entry")
        # Spans may warn again; those warnings were given when the rules were compiled.
        build = dataclasses.replace(compiled.build, warnings=[])
        return make(build, compiled.output, scope, self)

    @property
    def inputs(self) -> dict[str, Any]:
        return required_inputs(self.config)

    def gpu_idle_percent(self, default: float) -> float:
        """Below which utilization a GPU counts as idle: the first configured rule that
        defines it (`RuleSpec.gpu_idle_param`), else `default`."""
        for compiled in self.rules:
            param = compiled.instance.spec.gpu_idle_param
            if param:
                return compiled.instance.values[param]
        return default


def compile_rules(config: RulesConfig) -> Compiled:
    warnings = list(config.warnings)
    config = _applicable(config, warnings)
    groups: list[dict[str, Any]] = []
    seen: dict[tuple, str] = {}
    compiled: list[CompiledRule] = []
    every_scrape: list[dict[str, Any]] = []
    affected: list[Affected] = []
    for instance in config.rules:
        build = _build_context(config, instance, warnings)
        output = instance.spec.build(build)
        rules: list[dict[str, Any]] = []
        elsewhere: dict[str, str] = {}
        for rec in output.recordings:
            key = (rec.record, tuple(sorted(rec.labels.items())))
            if key in seen:
                if seen[key] != rec.expr:
                    raise AssertionError(f"recording {rec.record} built twice, differently")
                elsewhere[rec.record] = rec.expr
                continue
            seen[key] = rec.expr
            (every_scrape if rec.every_scrape else rules).append(_recording(rec))
        alerts = []
        for alert in output.alerts:
            # Groups are evaluated independently, so reading another group's recording
            # could lag one interval behind: spell its expression out instead.
            alert = dataclasses.replace(alert, expr=_inline(alert.expr, elsewhere))
            found = _affected(instance, build, alert)
            affected.append(found)
            rules.append(found.recording(_condition(config, alert)))
            alerts.append(_alert(config, instance, alert, found))
        rules += alerts
        group = {
            "name": group_name(instance.spec.name),
            "interval": format_duration(instance.evaluation_interval),
            "rules": rules,
        }
        groups.append(group)
        compiled.append(CompiledRule(instance, build, output, group))
    groups[:0] = _adapter_groups(config, every_scrape)
    state = _state_rules(compiled)
    if state:
        fastest = min(i.evaluation_interval for i in config.rules)
        groups.append({"name": STATE_GROUP, "interval": format_duration(fastest), "rules": state})
    health = _health_rules(config, compiled, affected)
    if health:
        groups.append({"name": HEALTH_GROUP, "interval": "1m", "rules": health})
    return Compiled(groups, tuple(warnings), config, tuple(compiled), tuple(affected))


def _applicable(config: RulesConfig, warnings: list[str]) -> RulesConfig:
    """The configuration without the rules its `source` cannot serve, each named."""
    gpu, _ = sources.signal_sources(config.source)
    kept = []
    for instance in config.rules:
        if gpu in instance.spec.gpu_sources:
            kept.append(instance)
        else:
            warnings.append(
                f"{instance.where.split('.parameters.')[0]}: {instance.spec.name} "
                f"needs its GPU signals from {' or '.join(instance.spec.gpu_sources)}, not "
                f"{gpu}; left out"
            )
    if len(kept) == len(config.rules):
        return config
    return dataclasses.replace(config, rules=tuple(kept))


def _adapter_groups(config: RulesConfig, every_scrape: list[dict[str, Any]]) -> list[dict]:
    """The adapters' groups for a `source` setting naming dcgm or node_exporter, in their
    order; the rules' per-scrape recordings go into `trainprof.sources`, after its
    normalisation and before the alerts naming a missing input."""
    groups = sources.adapter_groups(config.source, _source_options(config))
    for group in groups:
        if group["name"] == sources.GROUP:
            rules = group["rules"]
            first_alert = next((i for i, r in enumerate(rules) if "alert" in r), len(rules))
            rules[first_alert:first_alert] = every_scrape
    return groups


def _source_options(config: RulesConfig) -> sources.SourceOptions:
    return dataclasses.replace(
        config.source_options,
        job_labels=config.job_labels,
        scrape_interval=config.scrape_interval,
    )


def _state_rules(compiled: list[CompiledRule]) -> list[dict[str, Any]]:
    """The job-state alerts of the configured rules (`TrainingNotStarted` with
    MaxInitializationTime, whose inputs it reads)."""
    out = []
    for c in compiled:
        if c.instance.spec.state is None:
            continue
        for state in c.instance.spec.state(c.build):
            out.append(
                {
                    "alert": state.alert,
                    "expr": state.expr,
                    "labels": {
                        "rule": STATE_RULE,
                        "severity": "info",
                        VERSION_LABEL: "1",
                    },
                    "annotations": {"summary": state.summary, "description": state.description},
                }
            )
    return out


def _inline(expr: str, recordings: dict[str, str]) -> str:
    for name, body in recordings.items():
        pattern = re.compile(rf"(?<![\w:]){re.escape(name)}(?![\w:{{])")

        def parenthesised(_: re.Match[str], body: str = body) -> str:
            return f"({body})"

        expr = pattern.sub(parenthesised, expr)
    return expr


def _build_context(config: RulesConfig, instance: RuleInstance, warnings: list) -> Build:
    gpu, host = sources.signal_sources(config.source)
    return Build(
        rule=instance.spec,
        p=instance.spec.values(instance.values),
        datapoint_interval=config.datapoint_interval,
        scrape_interval=config.scrape_interval,
        patience_mode=instance.patience_mode,
        job_labels=config.job_labels,
        matchers=config.job_selector,
        where=instance.where,
        warnings=warnings,
        given=instance.given,
        gauges=gauges_for(config.source),
        gpu_source=gpu,
        host_source=host,
    )


def _recording(rec: Recording) -> dict[str, Any]:
    out: dict[str, Any] = {"record": rec.record, "expr": rec.expr}
    if rec.labels:
        out["labels"] = dict(rec.labels)
    return out


def _affected(instance: RuleInstance, build: Build, alert: Alert) -> Affected:
    hold = alert.hold
    if hold is None:
        hold = default_hold(alert.for_seconds, build.patience_seconds, instance.evaluation_interval)
    elif hold:
        hold = max(hold, instance.evaluation_interval)
    return Affected(
        instance.spec.name,
        alert_name(instance.spec.name),
        instance.severity,
        dict(alert.labels),
        alert.units,
        hold,
    )


def _attributed(config: RulesConfig, alert: Alert) -> bool:
    """Whether the alert's GPUs take their job from the ranks' assignment: a source
    adapter's gauges carry the job already (trainprof.sources.gauges)."""
    from_adapter = sources.signal_sources(config.source)[0] != "trainprof"
    return alert.per_gpu and attributes_by_assignment(config) and not from_adapter


def _condition(config: RulesConfig, alert: Alert) -> str:
    """The alert's condition, one series per unit (or job) it holds for."""
    if _attributed(config, alert):
        return attribution.attribute(alert.expr, config.job_labels, config.job_selector)
    return alert.expr


def _alert(
    config: RulesConfig, instance: RuleInstance, alert: Alert, found: Affected
) -> dict[str, Any]:
    spec = instance.spec
    anchor = spec.name.lower()
    dashboard = (
        JOB_DASHBOARD.url(config.grafana_url)
        + "?var-training_job={{ $labels.training_job | urlquery }}"
        "&var-namespace={{ $labels.namespace | urlquery }}"
    )
    population = None
    if _attributed(config, alert):
        job = [f"{label}=%[{i}]q" for i, label in enumerate(config.job_labels, 1)]
        population = attribution.held_gpus(job, config.job_selector)
    description = found.description(
        alert.description, config.job_labels, config.job_selector, population
    )
    out: dict[str, Any] = {
        "alert": alert_name(spec.name),
        "expr": found.alert_expr(config.job_labels),
    }
    if alert.for_seconds:
        out["for"] = format_duration(alert.for_seconds)
    out["labels"] = {
        "rule": spec.name,
        "severity": instance.severity,
        VERSION_LABEL: str(spec.version),
        **alert.labels,
        **action_labels(instance.actions),
    }
    out["annotations"] = {
        "summary": alert.summary,
        "description": description,
        "recommendation": spec.recommendation,
        "runbook_url": f"{config.runbook_url}#{anchor}",
        "dashboard_url": dashboard,
    }
    return out


def action_labels(actions: tuple[str, ...]) -> dict[str, str]:
    """SageMaker's actions as alert labels: StopTraining -> action="stop" (the StopTraining
    receiver acts on it), Email / SMS -> notify="email", "sms" or "email,sms" (the routing
    sends such alerts to the notify / page receiver too).

    >>> action_labels(("StopTraining", "Email", "SMS"))
    {'action': 'stop', 'notify': 'email,sms'}
    """
    out = {}
    if "StopTraining" in actions:
        out["action"] = "stop"
    notify = [a.lower() for a in actions if a in ("Email", "SMS")]
    if notify:
        out["notify"] = ",".join(notify)
    return out


def attributes_by_assignment(config: RulesConfig) -> bool:
    """Whether per-GPU alerts take their job from the ranks' GPU assignment (a node-wide
    exporter) rather than from the exporter's own labels; `auto` means the latter."""
    return config.gpu_attribution == "assignment"


def _shared_gpu_check(
    config: RulesConfig, compiled: list[CompiledRule]
) -> tuple[HealthCheck, str] | None:
    """With attribution by assignment: a GPU several jobs hold belongs to none of them; the
    check, and the rules it affects."""
    rules = [c.name for c in compiled if any(a.per_gpu for a in c.output.alerts)]
    if not (rules and attributes_by_assignment(config)):
        return None
    check = HealthCheck(
        attribution.SHARED_ALERT,
        attribution.shared_expr(config.job_labels, config.job_selector),
        summary="GPUs are used by several jobs at once; their GPU rules are off.",
        description=(
            "are held by several jobs at once (time-slicing, MPS or MIG): their utilization "
            "and memory belong to no single job, so "
            + ", ".join(rules)
            + " leave them out. Give each job its own GPU (or MIG instance with its own UUID) "
            "to have them judged"
        ),
        units=Units(
            "gpu",
            "GPU",
            "GPUs",
            "{{ .Labels.uuid }}",
            None,
            "{{ .Value }} jobs",
            "jobs holding it",
        ),
    )
    return check, ",".join(rules)


def _exporters(series: str, measure: str, value: str = "{{ .Value }}") -> Units:
    return Units(
        "instance",
        "exporter",
        "exporters",
        "{{ .Labels.instance }}",
        Population(series),
        value,
        measure,
    )


def _health_rules(
    config: RulesConfig, compiled: list[CompiledRule], affected: list[Affected]
) -> list[dict[str, Any]]:
    """Alerts that say the rules are blind: the exporters sample at another interval than
    the rules were compiled for, or do not count the thresholds a rule selects. Like the
    rules' alerts, one per job (and check), each after its recording of the exporters,
    collectors or GPUs it found."""
    checks = (
        _exporter_checks(config) if any(c.instance.spec.reads_exporter for c in compiled) else []
    )
    for c in compiled:
        if c.instance.spec.health is not None:
            checks += [(check, c.name) for check in c.instance.spec.health(c.build)]
    checks += [(check, name) for name, check in tensor_input_checks(compiled)]
    shared = _shared_gpu_check(config, compiled)
    if shared:
        checks.append(shared)
    recordings, alerts = [], []
    for check, affects in checks:
        found, recording, alert = _health_alert(config, check, affects)
        affected.append(found)
        recordings.append(recording)
        alerts.append(alert)
    return recordings + alerts


# Tensor rules whose input is not one job's own series: the other job's (SimilarAcrossRuns).
_NOT_CHECKED = ("SimilarAcrossRuns",)


def tensor_input_checks(compiled: list[CompiledRule]) -> list[tuple[str, HealthCheck]]:
    """(rule, check) for each compiled tensor rule: its `TrainprofRuleInputMissing` fires
    for a job whose training process publishes health series but none the rule reads (not
    watched, or computed with other parameters than the rule was compiled with, such as
    LossNotDecreasing's num_steps)."""
    from trainprof.rules.catalog.health.common import FAMILY, input_present, input_selectors
    from trainprof.rules.promql import Matcher, selector

    out = []
    for c in compiled:
        spec = c.instance.spec
        if spec.family != FAMILY or not c.output.alerts or spec.name in _NOT_CHECKED:
            continue
        jobs = c.build.job_labels
        names = "|".join(n for m in contract.HEALTH_METRICS for n in contract.series_names(m))
        published = selector("", [Matcher("__name__", "=~", names), *c.build.matchers])
        present = input_present([a.expr for a in c.output.alerts], jobs)
        inputs = sorted(
            {re.sub(r"\{.*", "", s) for a in c.output.alerts for s in input_selectors(a.expr)}
        )
        by = ", ".join(jobs)
        out.append(
            (
                spec.name,
                HealthCheck(
                    INPUT_MISSING_ALERT,
                    f"count by ({by}) ({published})\nunless on ({by})\n({present})",
                    summary=f"{spec.name} finds none of the series it reads.",
                    description=(
                        "The training process of job {{ $labels.training_job }} publishes "
                        f"health series, but none {spec.name} reads ({', '.join(inputs)} with "
                        "the labels its parameters select), so it cannot fire. Give the "
                        "training process the rule configuration (TRAINPROF_RULES_CONFIG), "
                        "or watch what the rule reads; `trainprof rules compile` lists the "
                        "settings."
                    ),
                ),
            )
        )
    return out


def _exporter_checks(config: RulesConfig) -> list[tuple[HealthCheck, str]]:
    """The exporters sample at another interval than the rules assume, stall or fail."""
    from trainprof.rules.promql import selector

    interval = selector(contract.SAMPLER_INTERVAL_SECONDS, config.job_selector)
    return [
        (
            HealthCheck(
                "TrainprofSamplerIntervalMismatch",
                f"{interval} != {config.datapoint_interval:g}",
                summary="Exporters sample at another interval than the rules assume.",
                description=(
                    "sample at another interval than the datapoint interval the rules were "
                    f"compiled for ({config.datapoint_interval:g}s): windows and patience are "
                    "off by the same factor. Restart them with --datapoint-interval "
                    f"{config.datapoint_interval:g}s or recompile the rules"
                ),
                units=_exporters(
                    contract.SAMPLER_INTERVAL_SECONDS, "sampling interval", "{{ .Value }}s"
                ),
            ),
            "all",
        ),
        (
            HealthCheck(
                "TrainprofSamplerStalled",
                f"rate({selector('trainprof_samples_total', config.job_selector)}[1m]) == 0",
                summary="Exporters answer scrapes but have stopped sampling.",
                description=(
                    "took no sample in the last minute while they still answer scrapes (a hung "
                    "source, or their sampling thread stopped): the rules that read them see no "
                    "new data. Check their log and trainprof_collector_success; restart them "
                    "if the host is healthy"
                ),
                units=_exporters("trainprof_samples_total", "samples per second"),
            ),
            "all",
        ),
        (
            HealthCheck(
                "TrainprofCollectorFailing",
                # A host with nothing to read (no NVIDIA driver at all: a laptop, a CPU
                # node) says so in trainprof_collector_unavailable and is not paged.
                f"{selector('trainprof_collector_success', config.job_selector)} == 0"
                " unless ignoring (reason) "
                f"{selector('trainprof_collector_unavailable', config.job_selector)}",
                summary="Exporters' collectors keep failing.",
                description=(
                    "have failed every sample for 5 minutes (their source errors or does not "
                    "answer in time): the rules that read their series judge old data or none. "
                    "The exporter's log says why. (A host without any NVIDIA driver reports "
                    "trainprof_collector_unavailable instead and raises nothing.)"
                ),
                units=dataclasses.replace(
                    _exporters("trainprof_collector_success", "success"),
                    level="instance_collector",
                    singular="collector",
                    plural="collectors",
                    name="{{ .Labels.collector }} of {{ .Labels.instance }}",
                ),
            ),
            "all",
        ),
    ]


HEALTH_FOR = 300.0  # seconds a health condition holds before it alerts (and then holds)


def _health_alert(
    config: RulesConfig, check: HealthCheck, affects: str
) -> tuple[Affected, dict[str, Any], dict[str, Any]]:
    found = Affected(
        HEALTH_RULE,
        check.alert,
        "warning",
        {"affects": affects},
        check.units,
        HEALTH_FOR,
        metric=health_metric(check.alert),
    )
    description = found.description(
        check.description,
        config.job_labels,
        config.job_selector,
        # a GPU several jobs share is no job's
        named_job=check.alert != attribution.SHARED_ALERT,
    )
    return (
        found,
        found.recording(check.expr),
        {
            "alert": check.alert,
            "expr": found.alert_expr(config.job_labels),
            "for": format_duration(HEALTH_FOR),
            "labels": {
                "rule": HEALTH_RULE,
                "severity": "warning",
                "affects": affects,
                VERSION_LABEL: "1",
            },
            "annotations": {"summary": check.summary, "description": description},
        },
    )


def required_inputs(config: RulesConfig) -> dict[str, Any]:
    """Thresholds the exporters and the training API must count for these rules
    (`RuleSpec.inputs`).

    `trainprof exporter --rules.config` and `trainprof.start(rules_config=...)` read this.
    """
    needed: dict[str, Any] = {key: [] for key in INPUTS}
    for instance in config.rules:
        if instance.spec.inputs is None:
            continue
        build = _build_context(config, instance, [])
        for key, value in instance.spec.inputs(build).items():
            if key not in needed:
                raise KeyError(f"rule {instance.spec.name} asks for input {key}, not in {INPUTS}")
            needed[key].append(value)
    needed["datapoint_interval"] = config.datapoint_interval
    return needed


def process_settings(config: RulesConfig) -> list[str]:
    """What the training processes compute differently from their defaults for these
    tensor rules (LossNotDecreasing's num_steps, Overtraining's delta, ...): each a line
    naming the parameter; they must be given the configuration (TRAINPROF_RULES_CONFIG)."""
    said: list[str] = []
    for instance in config.rules:
        if instance.spec.inputs is None or instance.spec.reads_exporter:
            continue
        build = _build_context(config, instance, said)
        instance.spec.inputs(build)
    return list(dict.fromkeys(said))

"""Rule configuration: SageMaker's vocabulary in, checked and resolved rule instances out.

Accepted shapes (YAML or JSON):

    datapoint_interval: 0.5s          # what one SageMaker datapoint lasts
    scrape_interval: 15s              # how often Prometheus scrapes the exporters
    patience_mode: auto               # auto | for | warmup
    gpu_attribution: auto             # auto (= exporter) | exporter | assignment
    job_labels: [namespace, training_job]
    job_selector: {namespace: team-a, training_job: {regex: "bert-.*"}}
    links: {runbook_url: https://..., grafana_url: https://grafana.example.com}
    rules:                            # a list ...
      - rule: ProfilerReport
        parameters: {CPUBottleneck_cpu_threshold: 90}
      - rule: LowGPUUtilization
        parameters: {threshold_p95: "70"}
        severity: critical            # optional; also patience_mode
    # ... or a mapping: rules: {ProfilerReport: {CPUBottleneck_cpu_threshold: 90}}

and the `ProfilerRuleConfigurations` list of a SageMaker DescribeTrainingJob response, whose
`RuleParameters` carry `rule_to_invoke`. Every problem is collected and reported at once,
each with its path and the nearest valid name.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Mapping
from typing import Any

from trainprof.contract.durations import parse_duration
from trainprof.contract.names import JOB_LABELS
from trainprof.contract.validation import (
    ConfigError,
    Problem,  # noqa: F401  (re-exported: rule configuration errors are ConfigError)
    Problems,
    check_deep,
    describe,
    nearest,
    regex_problem,
    short,
    template_problem,
)
from trainprof.rules.catalog import registry
from trainprof.rules.model import PATIENCE_MODES, SEVERITIES, RuleSpec
from trainprof.rules.params import COUNT, MICROS, MINUTES, PERCENT
from trainprof.rules.promql import LABEL_NAME, Matcher
from trainprof.sources.options import SourceOptions, parse_sources

DEFAULT_RUNBOOK_URL = "https://github.com/trainprof/trainprof/blob/main/docs/rules.md"
DEFAULT_GRAFANA_URL = "http://localhost:3000"
_TOP_KEYS = (
    "datapoint_interval",
    "scrape_interval",
    "patience_mode",
    "gpu_attribution",
    "job_labels",
    "job_selector",
    "links",
    "rules",
    "source",
    "source_options",
    "ProfilerRuleConfigurations",
)
GPU_ATTRIBUTIONS = ("auto", "exporter", "assignment")
_ENTRY_KEYS = ("rule", "parameters", "severity", "patience_mode", "name", "actions")
# SageMaker's rule actions (rule_configs.StopTraining(), Email(...), SMS(...)).
ACTIONS = ("StopTraining", "Email", "SMS")
# What a DescribeTrainingJob response holds in the parts trainprof reads (the AWS API's
# spelling), so a typo is reported instead of silently losing the value.
_PROFILER_CONFIG_KEYS = (
    "S3OutputPath",
    "ProfilingIntervalInMilliseconds",
    "ProfilingParameters",
    "DisableProfiler",
)
_API_RULE_KEYS = (
    "RuleConfigurationName",
    "LocalPath",
    "S3OutputPath",
    "RuleEvaluatorImage",
    "InstanceType",
    "VolumeSizeInGB",
    "RuleParameters",
)
# Prometheus durations overflow at about 292 years; nothing a rule waits for is near this.
MAX_SPAN_SECONDS = 10 * 365 * 86400
_SELECTOR_OPS = {"regex": "=~", "not": "!=", "not_regex": "!~"}
_URL = re.compile(r"^https?://\S+$")


@dataclasses.dataclass(frozen=True)
class RuleInstance:
    spec: RuleSpec
    values: Mapping[str, Any]
    severity: str
    patience_mode: str  # for | warmup
    where: str  # config path of a parameter: where.format(param="window")
    # The parameters the configuration set: only these are warned about (a default that
    # trainprof adjusts is documented, not repeated at every compile).
    given: frozenset[str] = frozenset()
    actions: tuple[str, ...] = ()  # of ACTIONS, in that order

    @property
    def evaluation_interval(self) -> float:
        """Seconds between two evaluations of the rule's group.

        Summary rules (no alert) feed dashboards and the report, which need them no more
        than once a minute: they run up to 4 times less often than the alerts (a 15 s scan
        records summaries every minute), never slower than a minute unless the scan is.
        """
        scan = self.values["scan_interval_us"] / 1e6
        if self.spec.alerting:
            return scan
        return max(scan, min(SUMMARY_INTERVAL, 4 * scan))


SUMMARY_INTERVAL = 60.0  # seconds; the slowest cadence a summary rule's readers need


@dataclasses.dataclass(frozen=True)
class RulesConfig:
    rules: tuple[RuleInstance, ...]
    datapoint_interval: float = 0.5
    scrape_interval: float = 15.0
    patience_mode: str = "auto"
    # Where a GPU's job comes from: the exporter's own training_job label (exporter; auto)
    # or the ranks' trainprof_gpu_assignment_info (assignment: a node-wide DaemonSet).
    gpu_attribution: str = "auto"
    job_labels: tuple[str, ...] = JOB_LABELS
    job_selector: tuple[Matcher, ...] = ()
    runbook_url: str = DEFAULT_RUNBOOK_URL
    grafana_url: str = DEFAULT_GRAFANA_URL
    warnings: tuple[str, ...] = ()
    # Where the GPU and host signals come from: trainprof's exporter, dcgm-exporter (GPU)
    # and/or node_exporter (host); see trainprof.sources.
    source: tuple[str, ...] = ("trainprof",)
    source_options: SourceOptions = SourceOptions()

    def rule(self, name: str) -> RuleInstance | None:
        return next((r for r in self.rules if r.spec.name == name), None)


def alerting(config: RulesConfig) -> tuple[RuleInstance, ...]:
    """The configured rules that alert (not the summary rules), in report order."""
    return tuple(i for i in config.rules if i.spec.alerting)


_Parsed = tuple[dict[str, Any], frozenset[str]]  # a rule's values, and the names set


class _Loader(Problems):
    def __init__(self) -> None:
        super().__init__()
        self.custom: dict[str, RuleSpec] = {}  # custom rules of this configuration, by name
        self.definitions: dict[str, Any] = {}  # their custom.Definition, by name
        self.refused: set[str] = set()  # custom rules whose parameters were refused

    def problem(self, path: str, message: str) -> None:
        self.add(path, message)

    # --- top level ---------------------------------------------------------------------

    def load(self, data: Any, scrape_interval: float | None) -> RulesConfig | None:
        if data is None:
            data = {}
        if isinstance(data, list):
            data = {"rules": data}
        if not isinstance(data, Mapping):
            self.problem("", f"expected a mapping with a `rules` list, got {describe(data)}")
            return None
        if "ProfilerRuleConfigurations" in data:
            data = self.describe_training_job(data)
        self.unknown_keys(data, "", _TOP_KEYS)

        datapoint = self.duration(data, "datapoint_interval", 0.5, maximum=3600)
        scrape = self.duration(data, "scrape_interval", 15.0, maximum=3600)
        if scrape_interval is not None:
            scrape = scrape_interval
        mode = data.get("patience_mode", "auto")
        if not self.one_of("patience_mode", mode, PATIENCE_MODES):
            mode = "auto"
        attribution = data.get("gpu_attribution", "auto")
        self.one_of("gpu_attribution", attribution, GPU_ATTRIBUTIONS)
        job_labels = self.labels(data.get("job_labels", list(JOB_LABELS)))
        selector = self.selector(data.get("job_selector", {}))
        runbook, grafana = self.links(data.get("links", {}))
        source = self.source(data.get("source", "trainprof"))
        source_options = self.source_options(data.get("source_options", {}), job_labels, scrape)

        entries = self.entries(data)
        rules = self.resolve(entries, mode)
        self.check_spans(rules, datapoint)
        self.check_custom(rules)
        if self.problems:
            return None
        return RulesConfig(
            rules=rules,
            datapoint_interval=datapoint,
            scrape_interval=scrape,
            patience_mode=mode,
            gpu_attribution=attribution,
            job_labels=job_labels,
            job_selector=selector,
            runbook_url=runbook,
            grafana_url=grafana,
            warnings=tuple(self.warnings),
            source=source,
            source_options=source_options,
        )

    def describe_training_job(self, data: Mapping) -> dict:
        """Keep what matters of a DescribeTrainingJob response: its profiler rules and the
        sampling interval of its ProfilerConfig; the job's other fields are not ours."""
        kept = {k: v for k, v in data.items() if k in _TOP_KEYS}
        profiler = data.get("ProfilerConfig")
        millis = None
        if isinstance(profiler, Mapping):
            self.unknown_keys(profiler, "ProfilerConfig", _PROFILER_CONFIG_KEYS)
            millis = profiler.get("ProfilingIntervalInMilliseconds")
        elif profiler is not None:
            self.problem("ProfilerConfig", f"expected a mapping, got {describe(profiler)}")
        if millis is not None and "datapoint_interval" not in kept:
            if isinstance(millis, bool) or not isinstance(millis, (int, float, str)):
                self.problem(
                    "ProfilerConfig.ProfilingIntervalInMilliseconds",
                    f"expected a number of milliseconds, got {describe(millis)}",
                )
            else:
                kept["datapoint_interval"] = f"{millis}ms"
        return kept

    def duration(self, data, key, default, maximum):
        if key not in data:
            return default
        try:
            seconds = parse_duration(data[key])
        except ValueError as e:
            self.problem(key, str(e))
            return default
        if not 0 < seconds <= maximum:
            self.problem(key, f"{data[key]!r} must be more than 0 and at most {maximum:g}s")
            return default
        return seconds

    def labels(self, value) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.problem("job_labels", f"expected a list of label names, got {describe(value)}")
            return JOB_LABELS
        if not value:
            self.problem(
                "job_labels",
                "empty: name at least one label that tells jobs apart (e.g. [training_job])",
            )
        for i, name in enumerate(value):
            if not LABEL_NAME.match(name):
                self.problem(f"job_labels[{i}]", f"{short(name)} is not a valid label name")
            elif name.startswith("__"):
                self.problem(
                    f"job_labels[{i}]", f"{name!r}: names starting with __ are Prometheus's own"
                )
            elif name in value[:i]:
                self.problem(f"job_labels[{i}]", f"{name!r} is listed twice")
        return tuple(value)

    def selector(self, value) -> tuple[Matcher, ...]:
        if not isinstance(value, Mapping):
            self.problem(
                "job_selector", f"expected a mapping of label: value, got {describe(value)}"
            )
            return ()
        matchers = []
        for label, spec in value.items():
            path = f"job_selector.{label}"
            if not isinstance(label, str) or not LABEL_NAME.match(label):
                self.problem(path, f"{short(label)} is not a valid label name")
                continue
            if label.startswith("__"):
                self.problem(path, f"{label!r}: names starting with __ are Prometheus's own")
                continue
            if isinstance(spec, Mapping):
                if len(spec) != 1 or next(iter(spec)) not in _SELECTOR_OPS:
                    self.problem(
                        path,
                        "expected a value, or one of "
                        + ", ".join(f"{{{k}: ...}}" for k in _SELECTOR_OPS),
                    )
                    continue
                key, text = next(iter(spec.items()))
                op = _SELECTOR_OPS[key]
            else:
                op, text = "=", spec
            if isinstance(text, bool) or not isinstance(text, (str, int, float)):
                self.problem(path, f"expected a string, got {describe(text)}")
                continue
            text = str(text)
            if "~" in op:
                why = regex_problem(text)
                if why:
                    self.problem(path, f"{short(text)} {why}")
                    continue
            matchers.append(Matcher(label, op, text))
        return tuple(sorted(matchers, key=lambda m: (m.label, m.op)))

    def source(self, value) -> tuple[str, ...]:
        """`trainprof`, `dcgm`, `node_exporter`, or a combination (a list or a comma-separated
        string); `trainprof` alongside both others has nothing left to serve."""
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)
        if not isinstance(value, str):
            self.problem(
                "source", f"expected a source name or a list of them, got {describe(value)}"
            )
            return ("trainprof",)
        try:
            names = parse_sources(value)
        except ValueError as e:
            self.problem("source", str(e))
            return ("trainprof",)
        return names

    def source_options(self, value, job_labels: tuple[str, ...], scrape: float) -> SourceOptions:
        keys = ("node_label", "pod_job_label")
        if not isinstance(value, Mapping):
            self.problem("source_options", f"expected a mapping, got {describe(value)}")
            value = {}
        self.unknown_keys(value, "source_options", keys)
        given = {k: value[k] for k in keys if k in value}
        for key, label in given.items():
            if not isinstance(label, str) or (label and not LABEL_NAME.match(label)):
                self.problem(f"source_options.{key}", f"{short(label)} is not a valid label name")
                return SourceOptions(job_labels=job_labels, scrape_interval=scrape)
        if given.get("node_label") == "":
            self.problem("source_options.node_label", "empty: name the label holding the node")
            given.pop("node_label")
        try:
            return SourceOptions(**given, job_labels=job_labels, scrape_interval=scrape)
        except ValueError as e:
            self.problem("source_options", str(e))
            return SourceOptions(scrape_interval=scrape)

    def links(self, value) -> tuple[str, str]:
        runbook, grafana = DEFAULT_RUNBOOK_URL, DEFAULT_GRAFANA_URL
        if not isinstance(value, Mapping):
            self.problem("links", f"expected a mapping, got {describe(value)}")
            return runbook, grafana
        for key, url in value.items():
            if key not in ("runbook_url", "grafana_url"):
                self.problem(
                    f"links.{key}",
                    "unknown key" + nearest(str(key), ("runbook_url", "grafana_url")),
                )
            elif isinstance(url, str) and (why := template_problem(url)):
                self.problem(f"links.{key}", why)
            elif not isinstance(url, str) or not _URL.match(url):
                self.problem(f"links.{key}", f"{short(url)} is not an http(s) URL")
            elif key == "runbook_url":
                runbook = url
            else:
                grafana = url.rstrip("/")
        return runbook, grafana

    # --- rule entries ------------------------------------------------------------------

    def entries(self, data) -> list[tuple[str, str, dict, dict]]:
        """(path, rule name, parameters, options) per entry, shapes normalised."""
        out = []
        if "ProfilerRuleConfigurations" in data:
            raw = data["ProfilerRuleConfigurations"]
            if not isinstance(raw, list):
                self.problem("ProfilerRuleConfigurations", f"expected a list, got {describe(raw)}")
            else:
                for i, item in enumerate(raw):
                    out += self.api_entry(f"ProfilerRuleConfigurations[{i}]", item)
        rules = data.get("rules", [] if out else [{"rule": registry.PROFILER_REPORT}])
        if isinstance(rules, Mapping):
            for name, params in rules.items():
                path = f"rules.{name}"
                if params is None:
                    params = {}
                if not isinstance(params, Mapping):
                    self.problem(path, f"expected a mapping of parameters, got {describe(params)}")
                    continue
                out.append((path, str(name), dict(params), {}))
        elif isinstance(rules, list):
            for i, item in enumerate(rules):
                out += self.list_entry(f"rules[{i}]", item)
        else:
            self.problem("rules", f"expected a list or a mapping of rules, got {describe(rules)}")
        if not out and not self.problems:
            self.problem("rules", "no rules configured")
        return out

    def list_entry(self, path, item):
        if isinstance(item, str):
            return [(path, item, {}, {})]
        if not isinstance(item, Mapping):
            self.problem(path, f"expected a mapping with a `rule` key, got {describe(item)}")
            return []
        if "RuleParameters" in item:
            return self.api_entry(path, item)
        if "custom" in item:
            return self.custom_entry(path, item)
        for key in item:
            if key not in _ENTRY_KEYS:
                self.problem(
                    f"{path}.{key}",
                    "unknown key"
                    + nearest(str(key), _ENTRY_KEYS)
                    + f"; valid keys: {', '.join(_ENTRY_KEYS)}",
                )
        if "rule" not in item:
            self.problem(path, "missing `rule` (the SageMaker rule name, e.g. ProfilerReport)")
            return []
        params = item.get("parameters") or {}
        if not isinstance(params, Mapping):
            self.problem(f"{path}.parameters", f"expected a mapping, got {describe(params)}")
            params = {}
        options = {}
        for key, valid in (("severity", SEVERITIES), ("patience_mode", PATIENCE_MODES)):
            if key not in item:
                continue
            if self.one_of(f"{path}.{key}", item[key], valid):
                options[key] = item[key]
        if "actions" in item:
            options["actions"] = self.actions(f"{path}.actions", item["actions"])
        return [(path, str(item["rule"]), dict(params), options)]

    def custom_entry(self, path, item):
        """A custom rule (trainprof.rules.custom): defined here, then used like a rule."""
        from trainprof.rules import custom

        reserved = {r.name.lower() for r in registry.CATALOG} | {
            n.lower() for n in (*registry.NOT_IMPLEMENTED, registry.PROFILER_REPORT)
        }
        definition = custom.definition(path, item, self.problem, reserved)
        if definition is None:
            return []
        if definition.name in self.custom:
            self.problem(f"{path}.custom", f"custom rule {definition.name} is defined twice")
            return []
        if shutil.which("promtool") is None:
            self.warnings.append(f"{path}.expr: not checked (promtool is not installed)")
        self.custom[definition.name] = custom.spec_of(definition)
        self.definitions[definition.name] = definition
        options: dict[str, Any] = {"definition": True}
        if "actions" in item:
            options["actions"] = self.actions(f"{path}.actions", item["actions"])
        if "severity" in item:
            options["severity"] = item["severity"]
        return [(path, definition.name, {}, options)]

    def lookup(self, name: str) -> RuleSpec | None:
        return self.custom.get(name) or registry.lookup(name)

    def actions(self, path: str, value: Any) -> tuple[str, ...]:
        """StopTraining, Email, SMS: names, or mappings such as {Email: address} (the
        address belongs in Alertmanager's receiver, not in the rules)."""
        items = value if isinstance(value, list) else [value]
        found = set()
        for i, item in enumerate(items):
            name = next(iter(item), None) if isinstance(item, Mapping) and len(item) == 1 else item
            match = next((a for a in ACTIONS if str(name).lower() == a.lower()), None)
            if match is None:
                self.problem(
                    f"{path}[{i}]",
                    f"{_kind(item)} is not an action"
                    + nearest(str(name), ACTIONS)
                    + f"; actions: {', '.join(ACTIONS)}",
                )
            else:
                found.add(match)
        return tuple(a for a in ACTIONS if a in found)

    def api_entry(self, path, item):
        """An entry of DescribeTrainingJob's ProfilerRuleConfigurations."""
        params = item.get("RuleParameters") if isinstance(item, Mapping) else None
        if isinstance(item, Mapping) and path.startswith("ProfilerRuleConfigurations"):
            self.unknown_keys(item, path, _API_RULE_KEYS)
        if not isinstance(params, Mapping) or "rule_to_invoke" not in params:
            self.problem(path, "expected RuleParameters with a rule_to_invoke")
            return []
        params = dict(params)
        return [(f"{path}.RuleParameters", str(params.pop("rule_to_invoke")), params, {})]

    # --- resolution --------------------------------------------------------------------

    def resolve(self, entries, default_mode) -> tuple[RuleInstance, ...]:
        report: dict[str, tuple[str, _Parsed, dict]] = {}  # from ProfilerReport
        explicit: dict[str, tuple[str, _Parsed, dict]] = {}
        for path, name, params, options in entries:
            params.pop("rule_to_invoke", None)
            if name.lower() == registry.PROFILER_REPORT.lower():
                if report:
                    self.problem(path, "ProfilerReport is configured twice")
                for rule_name, (sub_path, values) in self.report_params(path, params).items():
                    report[rule_name] = (sub_path, values, options)
                continue
            spec = self.lookup(name)
            if spec is None:
                self.unknown_rule(path, name)
                continue
            definition = explicit.get(spec.name, (None, None, {}))[2].get("definition")
            if spec.name in explicit and definition:
                # a custom rule's definition, then an entry overriding its parameters
                options = {**explicit[spec.name][2], **options, "definition": False}
            elif spec.name in explicit:
                self.problem(
                    path,
                    f"{spec.name} is configured twice (also at "
                    f"{explicit[spec.name][0]}); SageMaker ran each rule once per job",
                )
                continue
            given = {str(k): (v, f"{path}.parameters.{k}") for k, v in params.items()}
            before = len(self.problems)
            values = self.parse_values(spec, given, f"{path}.parameters")
            explicit[spec.name] = (path, values, options)
            if len(self.problems) > before:
                self.refused.add(spec.name)

        instances = []
        for spec in registry.CATALOG + tuple(self.custom.values()):
            if spec.name in explicit:
                path, values, options = explicit[spec.name]
                if spec.name in report:
                    self.warnings.append(
                        f"{path}: {spec.name} is also part of ProfilerReport; this entry's "
                        "parameters are used and the report's overrides for it are ignored"
                    )
                path += ".parameters.{param}"
            elif spec.name in report:
                path, values, options = report[spec.name]
            else:
                continue
            instances.append(self.instance(path, spec, values, options, default_mode))
        return tuple(instances)

    def report_params(self, path, params) -> dict[str, tuple[str, _Parsed]]:
        """Split ProfilerReport's `<Rule>_<param>` overrides onto every catalog rule."""
        per_rule: dict[str, dict[str, tuple[Any, str]]] = {
            s.name: {} for s in registry.profiler_rules()
        }
        scan = None
        for key, value in params.items():
            key = str(key)
            where = f"{path}.parameters.{key}"
            if key == "scan_interval_us":
                scan = value
                continue
            rule_name, sep, param = key.partition("_")
            spec = registry.lookup(rule_name) if sep else None
            if spec is not None and spec not in registry.profiler_rules():
                self.problem(
                    where,
                    f"{spec.name} is not part of ProfilerReport; configure it as a rule of "
                    f"its own (- rule: {spec.name})",
                )
                continue
            if spec is None:
                if rule_name in registry.NOT_IMPLEMENTED:
                    self.warnings.append(f"{where}: ignored; {registry.NOT_IMPLEMENTED[rule_name]}")
                    continue
                valid = [r.name for r in registry.profiler_rules()]
                self.problem(
                    where,
                    "expected <Rule>_<parameter> with a rule of the report"
                    + nearest(rule_name, valid)
                    + f"; rules: {', '.join(valid)}",
                )
                continue
            per_rule[spec.name][param] = (value, where)
        out = {}
        for spec in registry.profiler_rules():
            given = per_rule[spec.name]
            if scan is not None and "scan_interval_us" not in given:
                given["scan_interval_us"] = (scan, f"{path}.parameters.scan_interval_us")
            parsed = self.parse_values(spec, given)
            out[spec.name] = (f"{path}.parameters.{spec.name}_{{param}}", parsed)
        return out

    def parse_values(
        self, spec: RuleSpec, given: dict[str, tuple[Any, str]], where_params: str = ""
    ) -> _Parsed:
        """(every parameter's value, the names the configuration set)."""
        values = spec.defaults()
        written: set[str] = set()
        failed = False
        names = [p.name for p in spec.params]
        for key, (raw, where) in given.items():
            match = next((n for n in names if n.lower() == key.lower()), None)
            if match is None:
                self.problem(
                    where,
                    f"unknown parameter of {spec.name}"
                    + nearest(key, names)
                    + f"; parameters: {', '.join(names)}",
                )
                continue
            kind = spec.param(match).kind
            try:
                values[match] = kind.parse(raw)
            except ValueError as e:
                self.problem(where, str(e))
                failed = True
                continue
            written.add(match)
            if kind is PERCENT and 0 < values[match] < 1:
                self.warn(
                    where,
                    f"{short(raw)} is read as {values[match]:g} %, not "
                    f"{values[match] * 100:g} %; percentages are 0 to 100 (if you meant "
                    f"{values[match] * 100:g} %, write {values[match] * 100:g})",
                )
        if spec.check is not None and not failed:
            wheres = {k.lower(): w for k, (_, w) in given.items()}
            for name, message in spec.check(spec.values(values)):
                where = wheres.get(name.lower()) or f"{where_params or spec.name}.{name}"
                self.problem(where, message)
        return values, frozenset(written)

    def check_spans(self, rules: tuple[RuleInstance, ...], datapoint: float) -> None:
        """Windows and intervals Prometheus can still write as a duration."""
        for instance in rules:
            for param in instance.spec.params:
                value = instance.values.get(param.name)
                if param.kind is COUNT and value is not None:
                    seconds, what = value * datapoint, f"{value} datapoints x {datapoint:g}s"
                elif param.kind is MICROS and value is not None:
                    seconds, what = value / 1e6, f"{value} microseconds"
                elif param.kind is MINUTES and value is not None:
                    seconds, what = value * 60, f"{value:g} minutes"
                    if seconds < 1:
                        self.problem(
                            instance.where.format(param=param.name),
                            f"{what} is less than a second; write at least 0.0167 (1 s)",
                        )
                        continue
                else:
                    continue
                if seconds > MAX_SPAN_SECONDS:
                    self.problem(
                        instance.where.format(param=param.name),
                        f"{what} lasts more than 10 years; Prometheus cannot wait that long",
                    )

    def check_custom(self, rules: tuple[RuleInstance, ...]) -> None:
        """promtool's word on every custom rule as it will be compiled (overrides applied,
        expression and annotations), in one run; rules already refused are left out."""
        from trainprof.rules import custom

        promtool = shutil.which("promtool")
        checked = [
            (i.where.partition(".parameters")[0], self.definitions[i.spec.name], i.values)
            for i in rules
            if i.spec.name in self.definitions and i.spec.name not in self.refused
        ]
        if promtool is None or not checked:
            return
        for path, message in custom.promtool_problems(checked, promtool):
            self.problem(path, message)

    def unknown_rule(self, path, name):
        if name in registry.NOT_IMPLEMENTED:
            self.problem(path, f"{name}: {registry.NOT_IMPLEMENTED[name]}")
            return
        valid = [registry.PROFILER_REPORT] + [r.name for r in registry.CATALOG]
        self.problem(
            path, f"unknown rule {name!r}" + nearest(name, valid) + f"; rules: {', '.join(valid)}"
        )

    def instance(self, where, spec, parsed, options, default_mode) -> RuleInstance:
        values, given = parsed
        mode = options.get("patience_mode", default_mode)
        if mode == "auto":
            mode = spec.patience_auto
        return RuleInstance(
            spec,
            values,
            options.get("severity", spec.severity),
            mode,
            where,
            given,
            tuple(options.get("actions", ())),
        )


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return {dict: "a mapping", list: "a list", str: f"the string {value!r}", bool: f"{value}"}.get(
        type(value), f"{type(value).__name__} {value!r}"
    )


def load_config(
    data: Any, source: str = "configuration", scrape_interval: float | None = None
) -> RulesConfig:
    """Check and resolve a parsed configuration; raises ConfigError listing every problem."""
    check_deep(data, source)
    loader = _Loader()
    config = loader.load(data, scrape_interval)
    if config is None:
        raise ConfigError(loader.problems, source)
    return config


def default_config(scrape_interval: float | None = None) -> RulesConfig:
    """ProfilerReport with every default: what SageMaker attached to a job by default."""
    return load_config({"rules": [{"rule": registry.PROFILER_REPORT}]}, "defaults", scrape_interval)

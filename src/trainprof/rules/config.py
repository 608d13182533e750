"""Rule configuration: SageMaker's vocabulary in, checked and resolved rule instances out.

Accepted shapes (YAML or JSON):

    datapoint_interval: 0.5s          # what one SageMaker datapoint lasts
    scrape_interval: 15s              # how often Prometheus scrapes the exporters
    patience_mode: auto               # auto | for | warmup
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
import difflib
import re
from collections.abc import Mapping
from typing import Any

from trainprof.durations import parse_duration
from trainprof.rules import catalog
from trainprof.rules.model import PATIENCE_MODES, SEVERITIES, RuleSpec
from trainprof.rules.promql import LABEL_NAME, Matcher

DEFAULT_RUNBOOK_URL = "https://github.com/trainprof/trainprof/blob/main/docs/rules.md"
DEFAULT_GRAFANA_URL = "http://localhost:3000"
_TOP_KEYS = (
    "datapoint_interval",
    "scrape_interval",
    "patience_mode",
    "job_labels",
    "job_selector",
    "links",
    "rules",
    "ProfilerRuleConfigurations",
)
_ENTRY_KEYS = ("rule", "parameters", "severity", "patience_mode", "name")
_SELECTOR_OPS = {"regex": "=~", "not": "!=", "not_regex": "!~"}


@dataclasses.dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(Exception):
    """One or more problems in a rule configuration; str() lists all of them."""

    def __init__(self, problems: list[Problem], source: str = "configuration"):
        self.problems = problems
        self.source = source
        super().__init__(str(self))

    def __str__(self) -> str:
        n = len(self.problems)
        head = f"{self.source}: {n} problem{'s' if n != 1 else ''}"
        return head + "".join(f"\n  {p}" for p in self.problems)


@dataclasses.dataclass(frozen=True)
class RuleInstance:
    spec: RuleSpec
    values: Mapping[str, Any]
    severity: str
    patience_mode: str  # for | warmup
    where: str  # config path of a parameter: where.format(param="window")

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
    job_labels: tuple[str, ...] = ("namespace", "training_job")
    job_selector: tuple[Matcher, ...] = ()
    runbook_url: str = DEFAULT_RUNBOOK_URL
    grafana_url: str = DEFAULT_GRAFANA_URL
    warnings: tuple[str, ...] = ()

    def rule(self, name: str) -> RuleInstance | None:
        return next((r for r in self.rules if r.spec.name == name), None)


def alerting(config: RulesConfig) -> tuple[RuleInstance, ...]:
    """The configured rules that alert (not the summary rules), in report order."""
    return tuple(i for i in config.rules if i.spec.alerting)


def nearest(name: str, candidates) -> str:
    """' (did you mean X?)' for the closest candidate, or ''."""
    candidates = list(candidates)
    folded = {c.lower(): c for c in candidates}
    if name.lower() in folded:
        return f" (did you mean {folded[name.lower()]}?)"
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


class _Loader:
    def __init__(self):
        self.problems: list[Problem] = []
        self.warnings: list[str] = []

    def problem(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    # --- top level ---------------------------------------------------------------------

    def load(self, data: Any, scrape_interval: float | None) -> RulesConfig | None:
        if data is None:
            data = {}
        if isinstance(data, list):
            data = {"rules": data}
        if not isinstance(data, Mapping):
            self.problem("", f"expected a mapping with a `rules` list, got {_kind(data)}")
            return None
        if "ProfilerRuleConfigurations" in data:
            data = self.describe_training_job(data)
        for key in data:
            if key not in _TOP_KEYS:
                self.problem(
                    str(key),
                    "unknown key"
                    + nearest(str(key), _TOP_KEYS)
                    + f"; valid keys: {', '.join(_TOP_KEYS)}",
                )

        datapoint = self.duration(data, "datapoint_interval", 0.5, maximum=3600)
        scrape = self.duration(data, "scrape_interval", 15.0, maximum=3600)
        if scrape_interval is not None:
            scrape = scrape_interval
        mode = data.get("patience_mode", "auto")
        if mode not in PATIENCE_MODES:
            self.problem(
                "patience_mode",
                f"{mode!r} is not one of {', '.join(PATIENCE_MODES)}"
                + nearest(str(mode), PATIENCE_MODES),
            )
        job_labels = self.labels(data.get("job_labels", ["namespace", "training_job"]))
        selector = self.selector(data.get("job_selector", {}))
        runbook, grafana = self.links(data.get("links", {}))

        entries = self.entries(data)
        rules = self.resolve(entries, mode if mode in PATIENCE_MODES else "auto")
        if self.problems:
            return None
        return RulesConfig(
            rules=rules,
            datapoint_interval=datapoint,
            scrape_interval=scrape,
            patience_mode=mode,
            job_labels=job_labels,
            job_selector=selector,
            runbook_url=runbook,
            grafana_url=grafana,
            warnings=tuple(self.warnings),
        )

    def describe_training_job(self, data: Mapping) -> dict:
        """Keep what matters of a DescribeTrainingJob response: its profiler rules and the
        sampling interval of its ProfilerConfig; the job's other fields are not ours."""
        kept = {k: v for k, v in data.items() if k in _TOP_KEYS}
        profiler = data.get("ProfilerConfig")
        millis = (
            profiler.get("ProfilingIntervalInMilliseconds")
            if isinstance(profiler, Mapping)
            else None
        )
        if millis is not None and "datapoint_interval" not in kept:
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
            self.problem("job_labels", f"expected a list of label names, got {_kind(value)}")
            return ("namespace", "training_job")
        for i, name in enumerate(value):
            if not LABEL_NAME.match(name):
                self.problem(f"job_labels[{i}]", f"{name!r} is not a valid label name")
        return tuple(value)

    def selector(self, value) -> tuple[Matcher, ...]:
        if not isinstance(value, Mapping):
            self.problem("job_selector", f"expected a mapping of label: value, got {_kind(value)}")
            return ()
        matchers = []
        for label, spec in value.items():
            path = f"job_selector.{label}"
            if not isinstance(label, str) or not LABEL_NAME.match(label):
                self.problem(path, f"{label!r} is not a valid label name")
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
                self.problem(path, f"expected a string, got {_kind(text)}")
                continue
            text = str(text)
            if "~" in op:
                try:
                    re.compile(text)
                except re.error as e:
                    self.problem(path, f"{text!r} is not a valid regular expression: {e}")
                    continue
            matchers.append(Matcher(label, op, text))
        return tuple(sorted(matchers, key=lambda m: (m.label, m.op)))

    def links(self, value) -> tuple[str, str]:
        runbook, grafana = DEFAULT_RUNBOOK_URL, DEFAULT_GRAFANA_URL
        if not isinstance(value, Mapping):
            self.problem("links", f"expected a mapping, got {_kind(value)}")
            return runbook, grafana
        for key, url in value.items():
            if key not in ("runbook_url", "grafana_url"):
                self.problem(
                    f"links.{key}",
                    "unknown key" + nearest(str(key), ("runbook_url", "grafana_url")),
                )
            elif not isinstance(url, str) or not re.match(r"^https?://\S+$", url):
                self.problem(f"links.{key}", f"{url!r} is not an http(s) URL")
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
                self.problem("ProfilerRuleConfigurations", f"expected a list, got {_kind(raw)}")
            else:
                for i, item in enumerate(raw):
                    out += self.api_entry(f"ProfilerRuleConfigurations[{i}]", item)
        rules = data.get("rules", [] if out else [{"rule": catalog.PROFILER_REPORT}])
        if isinstance(rules, Mapping):
            for name, params in rules.items():
                path = f"rules.{name}"
                if params is None:
                    params = {}
                if not isinstance(params, Mapping):
                    self.problem(path, f"expected a mapping of parameters, got {_kind(params)}")
                    continue
                out.append((path, str(name), dict(params), {}))
        elif isinstance(rules, list):
            for i, item in enumerate(rules):
                out += self.list_entry(f"rules[{i}]", item)
        else:
            self.problem("rules", f"expected a list or a mapping of rules, got {_kind(rules)}")
        if not out and not self.problems:
            self.problem("rules", "no rules configured")
        return out

    def list_entry(self, path, item):
        if isinstance(item, str):
            return [(path, item, {}, {})]
        if not isinstance(item, Mapping):
            self.problem(path, f"expected a mapping with a `rule` key, got {_kind(item)}")
            return []
        if "RuleParameters" in item:
            return self.api_entry(path, item)
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
            self.problem(f"{path}.parameters", f"expected a mapping, got {_kind(params)}")
            params = {}
        options = {}
        for key, valid in (("severity", SEVERITIES), ("patience_mode", PATIENCE_MODES)):
            if key not in item:
                continue
            if item[key] in valid:
                options[key] = item[key]
            else:
                self.problem(
                    f"{path}.{key}",
                    f"{item[key]!r} is not one of {', '.join(valid)}"
                    + nearest(str(item[key]), valid),
                )
        return [(path, str(item["rule"]), dict(params), options)]

    def api_entry(self, path, item):
        """An entry of DescribeTrainingJob's ProfilerRuleConfigurations."""
        params = item.get("RuleParameters") if isinstance(item, Mapping) else None
        if not isinstance(params, Mapping) or "rule_to_invoke" not in params:
            self.problem(path, "expected RuleParameters with a rule_to_invoke")
            return []
        params = dict(params)
        return [(f"{path}.RuleParameters", str(params.pop("rule_to_invoke")), params, {})]

    # --- resolution --------------------------------------------------------------------

    def resolve(self, entries, default_mode) -> tuple[RuleInstance, ...]:
        report: dict[str, tuple[str, dict, dict]] = {}  # from ProfilerReport
        explicit: dict[str, tuple[str, dict, dict]] = {}
        for path, name, params, options in entries:
            params.pop("rule_to_invoke", None)
            if name.lower() == catalog.PROFILER_REPORT.lower():
                if report:
                    self.problem(path, "ProfilerReport is configured twice")
                for rule_name, (sub_path, values) in self.report_params(path, params).items():
                    report[rule_name] = (sub_path, values, options)
                continue
            spec = catalog.lookup(name)
            if spec is None:
                self.unknown_rule(path, name)
                continue
            if spec.name in explicit:
                self.problem(
                    path,
                    f"{spec.name} is configured twice (also at "
                    f"{explicit[spec.name][0]}); SageMaker ran each rule once per job",
                )
                continue
            given = {str(k): (v, f"{path}.parameters.{k}") for k, v in params.items()}
            explicit[spec.name] = (path, self.parse_values(spec, given), options)

        instances = []
        for spec in catalog.CATALOG:
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

    def report_params(self, path, params) -> dict[str, tuple[str, dict]]:
        """Split ProfilerReport's `<Rule>_<param>` overrides onto every catalog rule."""
        per_rule = {spec.name: {} for spec in catalog.CATALOG}
        scan = None
        for key, value in params.items():
            key = str(key)
            where = f"{path}.parameters.{key}"
            if key == "scan_interval_us":
                scan = value
                continue
            rule_name, sep, param = key.partition("_")
            spec = catalog.lookup(rule_name) if sep else None
            if spec is None:
                if rule_name in catalog.NOT_IMPLEMENTED:
                    self.warnings.append(f"{where}: ignored; {catalog.NOT_IMPLEMENTED[rule_name]}")
                    continue
                valid = [r.name for r in catalog.CATALOG]
                self.problem(
                    where,
                    "expected <Rule>_<parameter> with a rule of the report"
                    + nearest(rule_name, valid)
                    + f"; rules: {', '.join(valid)}",
                )
                continue
            per_rule[spec.name][param] = (value, where)
        out = {}
        for spec in catalog.CATALOG:
            given = per_rule[spec.name]
            if scan is not None and "scan_interval_us" not in given:
                given["scan_interval_us"] = (scan, f"{path}.parameters.scan_interval_us")
            values = self.parse_values(spec, given)
            out[spec.name] = (f"{path}.parameters.{spec.name}_{{param}}", values)
        return out

    def parse_values(self, spec: RuleSpec, given: dict[str, tuple[Any, str]]) -> dict:
        values = spec.defaults()
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
            try:
                values[match] = spec.param(match).kind.parse(raw)
            except ValueError as e:
                self.problem(where, str(e))
        return values

    def unknown_rule(self, path, name):
        if name in catalog.NOT_IMPLEMENTED:
            self.problem(path, f"{name}: {catalog.NOT_IMPLEMENTED[name]}")
            return
        valid = [catalog.PROFILER_REPORT] + [r.name for r in catalog.CATALOG]
        self.problem(
            path, f"unknown rule {name!r}" + nearest(name, valid) + f"; rules: {', '.join(valid)}"
        )

    def instance(self, where, spec, values, options, default_mode) -> RuleInstance:
        mode = options.get("patience_mode", default_mode)
        if mode == "auto":
            mode = spec.patience_auto
        return RuleInstance(spec, values, options.get("severity", spec.severity), mode, where)


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
    loader = _Loader()
    config = loader.load(data, scrape_interval)
    if config is None:
        raise ConfigError(loader.problems, source)
    return config


def default_config(scrape_interval: float | None = None) -> RulesConfig:
    """ProfilerReport with every default: what SageMaker attached to a job by default."""
    return load_config({"rules": [{"rule": catalog.PROFILER_REPORT}]}, "defaults", scrape_interval)

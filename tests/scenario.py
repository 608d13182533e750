"""Rule scenarios -> `promtool test rules` files.

A scenario (tests/scenarios/<Rule>.yaml) scripts what hosts did, sample by sample, and says
which alerts must be firing at which times. The harness feeds the samples through the
exporter's own `SampleAccumulator`, scrapes its series every `scrape_interval`, and writes
them as promtool `input_series`; the rules under test are the committed
`rules/trainprof.rules.yaml` or, when a case has a `config`, that configuration compiled.
Annotations are stripped: these tests pin behaviour, not wording.

Case keys:
    name, duration (default 20m), scrape_interval (15s), evaluation_interval (1m),
    datapoint_interval (0.5s; only with `config`), config (a rule configuration),
    hosts: {<name>: {cores, gpus, labels, sample_every, timeline: [{from, cpu, iowait,
            gpu_util, gpu_mem, mem}]}}   values: a number, a list (one per core/GPU), or
            {cycle: [...]} (one value per sample, repeating)
    labels: override the exporter's identity labels; null leaves one out (a DaemonSet's job)
    exporter_reads_config: the exporters count the config's thresholds (--rules.config)
    series: raw promtool input series (training metrics): `values` in promtool's notation,
            or a list of [value, duration] runs, each value scraped for that long
    holds: [{from, to, alertname?, alerts}]: the alerts fire at every evaluation from..to
            (an alert held through noise fires once and never resolves in between)
    held: true when other expectations rely on that hold (vmalert's replay cannot hold)
    expect: [{at, alertname?, alerts: [labels...], affected?: [labels...]}]
            alerts are one per job (and reason): their labels default to the case's job
            (namespace ml, training_job bert or the case's `training_job`; null leaves one
            out); `affected` lists the units the alert's `affected` recording holds then
            (trainprof.rules.job_alerts), each with its `reason`.
            labels shorthand: host (its exporter's labels), gpu, peer_gpu
    values: [{at, expr, samples: [{labels..., value}]}]
"""

from __future__ import annotations

import copy
import functools
import json
import re
from pathlib import Path
from typing import Any

import yaml

from trainprof.contract.durations import format_duration, parse_duration
from trainprof.contract.sampling import (
    BottleneckGrid,
    GpuSample,
    HostSample,
    SampleAccumulator,
    samples_of,
)
from trainprof.engines.promtool import encode, series_text
from trainprof.generation.render import to_yaml
from trainprof.replay.synthetic import segment_at, values_at
from trainprof.rules.compiler import compile_rules, required_inputs
from trainprof.rules.config import load_config

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
DEFAULT_RULES = Path(__file__).resolve().parent.parent / "rules" / "trainprof.rules.yaml"


# libyaml's parser where PyYAML has it (the same safe schema, about ten times faster): a
# scenario file is read once per session, a promtool test file once per case.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=SAFE_LOADER)


def load_cases() -> list[tuple[str, dict]]:
    """(case id, case) of every scenario file; each call gets cases of its own to change."""
    return copy.deepcopy(_parsed_cases())


@functools.cache
def _parsed_cases() -> list[tuple[str, dict]]:
    cases = []
    for path in sorted(SCENARIOS.glob("*.yaml")):
        doc = load_yaml(path.read_text())
        for case in doc["cases"]:
            case.setdefault("rule", doc["rule"])
            cases.append((f"{path.stem}: {case['name']}", case))
    return cases


# --- hosts and samples ----------------------------------------------------------------------


def host_labels(case: dict, name: str) -> dict[str, str]:
    host = case["hosts"][name]
    labels = {
        "job": "trainprof",
        "instance": f"{name}:9945",
        "node": name,
        "namespace": "ml",
        "training_job": case.get("training_job", "bert"),
    }
    for key, value in host.get("labels", {}).items():
        if value is None:  # a label the host does not have (a DaemonSet exporter's job)
            labels.pop(key, None)
        else:
            labels[key] = str(value)
    return labels


def host_samples(case: dict, name: str, datapoint: float, duration: float):
    host = case["hosts"][name]
    cores, gpus = host.get("cores", 4), host.get("gpus", 1)
    timeline = host.get("timeline", [{}])
    k = 1
    while k * datapoint <= duration + 1e-9:
        t = k * datapoint
        segment = segment_at(timeline, t)
        util = values_at(segment["gpu_util"], gpus, k)
        mem = values_at(segment["gpu_mem"], gpus, k)
        yield HostSample(
            timestamp=t,
            cpu_utilization=values_at(segment["cpu"], cores, k),
            cpu_iowait=values_at(segment["iowait"], cores, k),
            memory_used_ratio=values_at(segment["mem"], 1, k)[0],
            gpus=[
                GpuSample(i, f"GPU-{name}-{i}", utilization=util[i], memory_used_ratio=mem[i])
                for i in range(gpus)
            ],
        )
        k += 1


def exporter_grid(case: dict) -> BottleneckGrid:
    """The exporter's threshold grid; with `exporter_reads_config` it also counts the
    thresholds of the case's configuration, as `trainprof exporter --rules.config` does."""
    grid = BottleneckGrid.default()
    if case.get("exporter_reads_config"):
        needed = required_inputs(load_config(case["config"]))
        grid = grid.including(cpu=needed["cpu_bottleneck"], io=needed["io_bottleneck"])
    return grid


def scraped_series(case: dict, datapoint: float) -> list[dict[str, str]]:
    """The hosts' series as Prometheus would have scraped them, in promtool notation."""
    duration = parse_duration(case.get("duration", "20m"))
    scrape = parse_duration(case.get("scrape_interval", "15s"))
    steps = int(round(duration / scrape))
    table: dict[str, list[float | None]] = {}
    texts: dict[tuple, str] = {}  # a series' promtool text, worked out once per series
    for name in sorted(case.get("hosts", {})):
        every = parse_duration(case["hosts"][name].get("sample_every", f"{datapoint}s"))
        acc = SampleAccumulator(every, identity=host_labels(case, name), grid=exporter_grid(case))
        samples = host_samples(case, name, every, duration)
        pending = next(samples, None)
        for i in range(steps + 1):
            now = i * scrape
            while pending is not None and pending.timestamp <= now + 1e-9:
                acc.observe(pending)
                pending = next(samples, None)
            for sample_name, labels, value in samples_of(acc.families()):
                identity = (sample_name, *labels.items())
                key = texts.get(identity)
                if key is None:
                    key = texts[identity] = series_text(sample_name, labels)
                table.setdefault(key, [None] * (steps + 1))[i] = value
    return [{"series": key, "values": encode(values)} for key, values in table.items()]


# --- expectations --------------------------------------------------------------------------


def expand_labels(case: dict, spec: dict) -> dict[str, str]:
    spec = dict(spec)
    labels: dict[str, str] = {}
    host = spec.pop("host", None)
    if host is not None:
        labels.update(host_labels(case, host))
    for key in ("gpu", "peer_gpu"):
        if key in spec:
            index = spec.pop(key)
            labels[key] = str(index)
            labels[key.replace("gpu", "uuid")] = f"GPU-{host}-{index}"
    labels.update({k: str(v) for k, v in spec.items()})
    return labels


@functools.lru_cache(maxsize=4)
def _groups_in(path: Path) -> list[dict]:
    return load_yaml(path.read_text())["groups"]


def rule_groups(case: dict) -> list[dict]:
    if "config" in case:
        config = load_config(
            case["config"],
            f"scenario {case['name']}",
            parse_duration(case.get("scrape_interval", "15s")),
        )
        groups = compile_rules(config).groups
    else:
        # keyed by the path: the chart's tests point DEFAULT_RULES at its PrometheusRule
        groups = _groups_in(DEFAULT_RULES)
    groups = copy.deepcopy(groups)
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return groups


def runs(values: str | list, scrape: float) -> str:
    """promtool notation of `values`: already notation, or [value, duration] runs.

    >>> runs([[0.5, "1m"], [1, "30s"]], 15)
    '0.5x3 1x1'
    """
    if isinstance(values, str):
        return values
    out = []
    for value, duration in values:
        n = round(parse_duration(duration) / scrape)
        out.append(encode([float(value)] * n))  # YAML reads 1e-9 as a string
    return " ".join(out)


def held(case: dict) -> list[dict]:
    """The expectations of `holds`: the alerts at every evaluation from..to."""
    step = parse_duration(case.get("evaluation_interval", "1m"))
    out = []
    for h in case.get("holds", []):
        t, end = parse_duration(h["from"]), parse_duration(h["to"])
        while t <= end + 1e-9:
            e = {"at": format_duration(t), "alerts": h["alerts"]}
            if "alertname" in h:
                e["alertname"] = h["alertname"]
            out.append(e)
            t += step
    return out


def job_alert_labels(case: dict, spec: dict) -> dict[str, str]:
    """An expected alert's labels: the case's job unless the spec names (or nulls) them."""
    labels = {"namespace": "ml", "training_job": case.get("training_job", "bert")}
    if "host" in spec:
        labels = {}
    labels.update(expand_labels(case, {k: v for k, v in spec.items() if v is not None}))
    for key, value in spec.items():
        if value is None:
            labels.pop(key, None)
    return labels


def _affected_test(groups: list[dict], case: dict, e: dict, alertname: str) -> dict:
    """A promql_expr_test that the alert's `affected` recording holds exactly e's units."""
    records = sorted(
        {
            rule["record"]
            for group in groups
            for rule in group["rules"]
            if "record" in rule
            and rule["record"].endswith(":affected")
            and _alert_of(groups, rule) == alertname
        }
    )
    if not records:
        raise KeyError(f"no affected recording for {alertname} in the rules under test")
    static = _static_labels(groups, alertname)
    static.pop("trainprof_rule_version", None)
    matcher = "|".join(re.escape(r) for r in records)
    samples = []
    for unit in e["affected"]:
        labels = {**static, **expand_labels(case, unit)}
        text = "{" + ", ".join(f'{k}="{x}"' for k, x in sorted(labels.items())) + "}"
        samples.append({"labels": text, "value": 1})
    return {
        "expr": f'{{__name__=~"{matcher}"}} * 0 + 1',
        "eval_time": e["at"],
        "exp_samples": samples,
    }


def _alert_of(groups: list[dict], recording: dict) -> str | None:
    """The alert of the group that reads `recording` (by its record name and labels)."""
    for group in groups:
        if recording not in group["rules"]:
            continue
        for rule in group["rules"]:
            if "alert" in rule and recording["record"] in rule["expr"]:
                labels = rule.get("labels", {})
                if all(labels.get(k) == v for k, v in recording.get("labels", {}).items()):
                    return rule["alert"]
    return None


_rule_files: dict[str, str] = {}  # the committed rules are the same text for most cases


def _rule_file(groups: list[dict]) -> str:
    key = json.dumps(groups, sort_keys=True)
    if key not in _rule_files:
        _rule_files[key] = to_yaml({"groups": groups})
    return _rule_files[key]


def _static_labels(groups: list[dict], alertname: str) -> dict[str, str]:
    for group in groups:
        for rule in group["rules"]:
            if rule.get("alert") == alertname:
                labels = dict(rule.get("labels", {}))
                for varying in ("reason", "affects"):  # differ between a rule's alerts
                    labels.pop(varying, None)
                return labels
    raise KeyError(f"no alert named {alertname} in the rules under test")


def promtool_files(case: dict, workdir: Path) -> Path:
    """Write the rule file and the promtool test file for one case; return the test file."""
    groups = rule_groups(case)
    (workdir / "rules.yaml").write_text(_rule_file(groups))
    datapoint = parse_duration(
        case.get("config", {}).get("datapoint_interval", "0.5s")
        if isinstance(case.get("config"), dict)
        else "0.5s"
    )
    scrape = parse_duration(case.get("scrape_interval", "15s"))
    series = scraped_series(case, datapoint) + [
        {**s, "values": runs(s["values"], scrape)} for s in case.get("series", [])
    ]
    alert_tests = []
    expr_tests = []
    for e in [*case.get("expect", []), *held(case)]:
        alertname = e.get("alertname", f"Training{case['rule']}")
        static = _static_labels(groups, alertname)
        alert_tests.append(
            {
                "eval_time": e["at"],
                "alertname": alertname,
                "exp_alerts": [
                    {"exp_labels": {**static, **job_alert_labels(case, a)}} for a in e["alerts"]
                ],
            }
        )
        if "affected" in e:
            expr_tests.append(_affected_test(groups, case, e, alertname))
    for v in case.get("values", []):
        samples = []
        for s in v["samples"]:
            s = dict(s)
            value = s.pop("value")
            plain = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?$", v["expr"])
            name = s.pop("name", plain.group(1) if plain else None)
            labels = expand_labels(case, s)
            text = (
                series_text(name, labels)
                if name
                else ("{" + ", ".join(f'{k}="{x}"' for k, x in sorted(labels.items())) + "}")
            )
            samples.append({"labels": text, "value": value})
        expr_tests.append({"expr": v["expr"], "eval_time": v["at"], "exp_samples": samples})
    test: dict[str, Any] = {
        "interval": format_duration(parse_duration(case.get("scrape_interval", "15s"))),
        "input_series": series,
    }
    if alert_tests:
        test["alert_rule_test"] = alert_tests
    if expr_tests:
        test["promql_expr_test"] = expr_tests
    doc = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": case.get("evaluation_interval", "1m"),
        "tests": [test],
    }
    path = workdir / "test.yaml"
    path.write_text(json.dumps(doc, indent=1))  # JSON is YAML, and much quicker to write
    return path

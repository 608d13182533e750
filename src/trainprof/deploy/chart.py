"""The Helm chart's copies of generated artifacts (`helm/trainprof/files/`) and its values schema.

The chart templates read these with `.Files.Get` / `.Files.Glob`, so no PromQL, route or
dashboard is re-templated in Helm; `make generate` writes them, and the drift test fails when
a copy differs from what this module produces.

    files/rules/<Rule>.yaml          one rule group each (the PrometheusRule's per-rule switch),
                                     GPU alerts joined to jobs by GPU assignment
    files/dashboards/<name>.json     the Grafana dashboards, compact (each under 256 KiB)
    files/alertmanagerconfig.yaml    the AlertmanagerConfig spec (route, inhibitions, receivers)
    files/actions-kinds.yaml         what the actions receiver patches or deletes, per kind
    files/relabelings/*.yaml         the monitors' identity relabelling (trainprof.deploy.relabel)
    values.schema.json               every value, with the rule switches from the catalog
    everything else                  copied from src/trainprof/deploy/chart_src/ (the hand-written
                                     templates, values.yaml, Chart.yaml), with a header, so a
                                     wheel carries the chart for `trainprof export chart`

    >>> sorted(rule_files())[:2]
    ['files/rules/BatchSize.yaml', 'files/rules/CPUBottleneck.yaml']
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable
from typing import Any

from trainprof.contract.names import GROUP_PREFIX

CHART_DIR = "helm/trainprof"


def rule_key(group_name: str) -> str:
    """The values key that switches a rule group: `trainprof.CPUBottleneck` -> `CPUBottleneck`."""
    return group_name[len(GROUP_PREFIX) :] if group_name.startswith(GROUP_PREFIX) else group_name


def chart_config(config):
    """The chart runs a node-wide exporter, so unless a configuration says otherwise its GPU
    alerts take their job from the ranks' GPU assignment (trainprof.rules.attribution)."""
    if config.gpu_attribution == "auto":
        return dataclasses.replace(config, gpu_attribution="assignment")
    return config


def _groups(config=None) -> list[dict[str, Any]]:
    from trainprof.rules.compiler import compile_rules
    from trainprof.rules.config import default_config

    return compile_rules(chart_config(config or default_config())).groups


def rule_files(generator: str = "make generate") -> dict[str, str]:
    """`files/rules/<key>.yaml` -> one group as a YAML list item, ready to indent under
    `spec.groups`."""
    from trainprof.generation.render import to_yaml

    out = {}
    for group in _groups():
        text = to_yaml([group], generator)
        out[f"files/rules/{rule_key(group['name'])}.yaml"] = text
    return out


def rule_keys() -> list[str]:
    return [rule_key(g["name"]) for g in _groups()]


def dashboard_files() -> dict[str, str]:
    """Compact copies of dashboards/*.json: a ConfigMap holds each under kubectl's 256 KiB
    annotation limit with room to spare."""
    from trainprof.rules.compiler import compile_rules
    from trainprof.rules.config import default_config

    config = chart_config(default_config())
    compiled = compile_rules(config)
    return {f"files/dashboards/{name}": text for name, text in compact_dashboards(compiled).items()}


def compact_dashboards(compiled) -> dict[str, str]:
    """File name -> the dashboard's JSON for `compiled`'s configuration, on one line."""
    from trainprof import dashboards

    out = {}
    for path in dashboards.DASHBOARDS:
        model = json.loads(dashboards.render(path, compiled.config, compiled))
        text = json.dumps(model, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        out[os.path.basename(path)] = text + "\n"
    return out


def alertmanagerconfig_file(generator: str = "make generate") -> str:
    from trainprof.alerting import files as alerting
    from trainprof.generation.render import to_yaml

    return to_yaml(alerting.resource()["spec"], generator)


def actions_kinds_file(generator: str = "make generate") -> str:
    """Kind -> API group, version, resource and the verb per action, from the receiver's own
    table, so the chart's Role grants exactly what `trainprof actions serve` calls."""
    from trainprof.actions import kubernetes
    from trainprof.generation.render import to_yaml

    kinds = {
        name: {
            "group": kind.group,
            "version": kind.version,
            "resource": kind.plural,
            "verbs": dict(kubernetes.VERB),
        }
        for name, kind in kubernetes.KINDS.items()
    }
    return to_yaml(kinds, generator)


def relabeling_files(generator: str = "make generate") -> dict[str, str]:
    """The monitors' identity relabelling (trainprof.deploy.relabel), included verbatim."""
    from trainprof.deploy import relabel
    from trainprof.generation.render import to_yaml

    return {
        "files/relabelings/exporter.yaml": to_yaml(relabel.exporter_relabelings(), generator),
        "files/relabelings/ranks.yaml": to_yaml(relabel.rank_identity_relabelings(), generator),
        "files/relabelings/ranks-metric.yaml": to_yaml(
            relabel.rank_metric_relabelings(), generator
        ),
    }


def values_schema() -> str:
    from trainprof.deploy.chart_schema import schema

    return json.dumps(schema(rule_keys(), sorted(_action_kinds())), indent=2) + "\n"


def _action_kinds() -> list[str]:
    from trainprof.actions import kubernetes

    return list(kubernetes.KINDS)


SOURCE_PACKAGE = "trainprof.deploy.chart_src"
_COMMENT = {".tpl": "{{/* %s */}}", ".txt": "{{/* %s */}}", ".md": "<!-- %s -->"}


def source_files(generator: str = "make generate") -> dict[str, str]:
    """The hand-written chart files (package data), each with a generated-file header
    naming where to edit it."""
    from importlib import resources

    out = {}
    top = resources.files(SOURCE_PACKAGE)

    def walk(node, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.name in ("__pycache__", "__init__.py"):
                continue
            path = f"{prefix}{child.name}"
            if child.is_dir():
                walk(child, path + "/")
                continue
            text = child.read_text(encoding="utf-8")
            ext = os.path.splitext(child.name)[1]
            comment = _COMMENT.get(ext, "# %s")
            if path.startswith("templates/") and ext == ".yaml":
                comment = "{{- /* %s */ -}}"
            note = (
                f"Code generated by {generator} from src/trainprof/deploy/chart_src/{path}."
                " DO NOT EDIT."
            )
            out[path] = comment % note + "\n" + _fill_switches(_fill_version(text))

    walk(top, "")
    return out


def _fill_version(text: str) -> str:
    """Chart.yaml's `version` and `appVersion`: trainprof's own (`trainprof._version`).

    >>> from trainprof._version import __version__
    >>> _fill_version('appVersion: "@TRAINPROF_VERSION@"') == f'appVersion: "{__version__}"'
    True
    """
    from trainprof import _version

    return text.replace("@TRAINPROF_VERSION@", _version.__version__)


_SWITCHES = re.compile(r"^(?P<indent> *)# @rule-switches:.*\n", re.M)


def _fill_switches(text: str) -> str:
    """values.yaml's rule switches: one `<Rule>: true` per group the catalog compiles to."""

    def lines(match: re.Match) -> str:
        pad = match.group("indent")
        return "".join(f"{pad}{key}: true\n" for key in rule_keys())

    return _SWITCHES.sub(lines, text)


def artifacts(generator: str = "make generate") -> dict[str, str]:
    """Repository-relative path -> content, for trainprof.generation.generate."""
    files = {
        **source_files(generator),
        **rule_files(generator),
        **dashboard_files(),
        "files/alertmanagerconfig.yaml": alertmanagerconfig_file(generator),
        "files/actions-kinds.yaml": actions_kinds_file(generator),
        **relabeling_files(generator),
        "values.schema.json": values_schema(),
    }
    return {f"{CHART_DIR}/{path}": text for path, text in files.items()}


def helm_values(compiled, generator: str, warn: Callable[[str], None] | None = None) -> str:
    """A values file that puts a user's compiled rules into the chart (`trainprof rules
    compile --format helm-values`): the PrometheusRule then renders these groups instead of
    the chart's defaults, and the dashboards are drawn for the same source and thresholds;
    `prometheusRule.rules.<Rule>: false` still switches one off.
    Compiled for the chart's DaemonSet: `gpu_attribution: auto` means assignment here.
    `warn` hears why the dashboards could not be drawn, when they could not."""
    from trainprof.generation.render import to_yaml
    from trainprof.rules.compiler import compile_rules

    if compiled.config.gpu_attribution == "auto":
        compiled = compile_rules(chart_config(compiled.config))

    values: dict[str, Any] = {"prometheusRule": {"groups": compiled.groups}}
    exporter = exporter_values(tuple(compiled.config.source))
    if exporter:
        values["exporter"] = exporter
    dashboards, why = dashboard_values(compiled)
    if why and warn:
        warn(why)
    if dashboards:
        values["dashboards"] = dashboards
    return to_yaml(values, generator)


def exporter_values(sources: tuple[str, ...]) -> dict[str, Any]:
    """What the chart's exporter DaemonSet does for rules compiled for `sources`: nothing
    where dcgm-exporter and node_exporter serve every signal, no GPU collector where
    dcgm-exporter serves the GPUs, so a cluster never gets a second GPU poller unless the
    values ask for one (`--set exporter.enabled=true`).

    >>> exporter_values(("dcgm", "node_exporter"))
    {'enabled': False}
    >>> exporter_values(("dcgm",))
    {'nvidia': {'enabled': False}}
    >>> exporter_values(("trainprof",)), exporter_values(("node_exporter",))
    ({}, {})
    """
    if "dcgm" in sources and "node_exporter" in sources:
        return {"enabled": False}
    if "dcgm" in sources:
        return {"nvidia": {"enabled": False}}
    return {}


def dashboard_values(compiled) -> tuple[dict[str, Any], str | None]:
    """The chart's `dashboards` values for `compiled`, and why its dashboards could not be
    drawn (None when they were): they need ProfilerReport's recordings. Without them the
    chart's own dashboards stay for trainprof's exporter; for another source they would read
    series that cluster does not have, so they are switched off."""
    from trainprof.rules.compiler import MissingRecording

    try:
        return {"files": compact_dashboards(compiled)}, None
    except MissingRecording as e:
        if tuple(compiled.config.source) == ("trainprof",):
            return {}, f"the chart keeps its own dashboards, drawn for SageMaker's defaults: {e}"
        return {"enabled": False}, f"dashboards switched off for this source: {e}"

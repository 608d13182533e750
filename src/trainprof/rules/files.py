"""Reading rule configurations from files, and writing compiled rules to them."""

from __future__ import annotations

import os
import sys
from typing import Any

from trainprof.rules import sdk
from trainprof.rules.compiler import Compiled
from trainprof.rules.config import ConfigError, Problem, RulesConfig, load_config

FORMATS = ("rules", "prometheusrule", "helm-values")
OUTPUT_NAMES = {
    "rules": "trainprof.rules.yaml",
    "prometheusrule": "trainprof.prometheusrule.yaml",
    "helm-values": "trainprof.values.yaml",
}


def read_config(
    path: str | None, scrape_interval: float | None = None, datapoint_interval: str | None = None
) -> RulesConfig:
    """Load a configuration file (YAML, JSON, or Python with SageMaker SDK calls).

    No path means SageMaker's default: ProfilerReport with every default. Raises ConfigError.
    """
    if path is None:
        data: Any = {"rules": [{"rule": "ProfilerReport"}]}
        source = "defaults"
    else:
        source = "<stdin>" if path == "-" else path
        try:
            text = sys.stdin.read() if path == "-" else _read(path)
        except OSError as e:
            raise ConfigError([Problem("", f"cannot read: {e.strerror or e}")], source) from None
        except UnicodeDecodeError:
            raise ConfigError(
                [Problem("", "not a text file (expected UTF-8 YAML, JSON or Python)")], source
            ) from None
        data = _parse(text, source, python=path.endswith(".py"))
    if datapoint_interval is not None:
        if not isinstance(data, dict):
            data = {"rules": data}
        data = {**data, "datapoint_interval": datapoint_interval}
    return load_config(data, source, scrape_interval)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _parse(text: str, source: str, python: bool) -> Any:
    if python:
        found = sdk.extract(text, os.path.basename(source))
        if found.problems:
            raise ConfigError([Problem(p, m) for p, m in found.problems], source)
        for w in found.warnings:
            print(f"warning: {w}", file=sys.stderr)
        return found.config
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = getattr(e, "problem", None) or str(e)
        raise ConfigError([Problem(where, f"not valid YAML: {what}")], source) from None


def render(
    compiled: Compiled,
    fmt: str,
    generator: str,
    name: str = "trainprof-rules",
    namespace: str | None = None,
    labels: dict[str, str] | None = None,
) -> str:
    from trainprof import render as r

    if fmt == "rules":
        return r.to_yaml({"groups": compiled.groups}, generator)
    if fmt == "helm-values":
        from trainprof.chart import helm_values

        return helm_values(compiled, generator)
    return r.to_yaml(r.prometheus_rule(compiled.groups, name, namespace, labels or {}), generator)

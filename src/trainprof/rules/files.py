"""Reading rule configurations from files, and writing compiled rules to them."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

from trainprof.contract.validation import ConfigError, Problem, parse_yaml, read_text
from trainprof.rules import sdk
from trainprof.rules.compiler import Compiled
from trainprof.rules.config import RulesConfig, load_config

FORMATS = ("rules", "prometheusrule", "helm-values")
OUTPUT_NAMES = {
    "rules": "trainprof.rules.yaml",
    "prometheusrule": "trainprof.prometheusrule.yaml",
    "helm-values": "trainprof.values.yaml",
}


def read_config(
    path: str | None,
    scrape_interval: float | None = None,
    datapoint_interval: str | None = None,
    source: tuple[str, ...] | None = None,
) -> RulesConfig:
    """Load a configuration file (YAML, JSON, or Python with SageMaker SDK calls); `source`
    (a parsed `--source`) replaces the configuration's.

    No path means SageMaker's default: ProfilerReport with every default. Raises ConfigError.
    """
    config = _read_config(path, scrape_interval, datapoint_interval)
    if source is not None:
        config = dataclasses.replace(config, source=source)
    return config


def _read_config(
    path: str | None, scrape_interval: float | None, datapoint_interval: str | None
) -> RulesConfig:
    if path is None:
        data: Any = {"rules": [{"rule": "ProfilerReport"}]}
        source = "defaults"
    else:
        source = "<stdin>" if path == "-" else path
        if path == "-":
            try:
                text = sys.stdin.read()
            except UnicodeDecodeError:
                raise ConfigError([Problem("", "not UTF-8 text")], source) from None
        else:
            text = read_text(path, "a text file (expected UTF-8 YAML, JSON or Python)")
        if path.endswith(".py"):
            return _read_python(text, source, scrape_interval, datapoint_interval)
        data = parse_yaml(text, source)
    if datapoint_interval is not None:
        if not isinstance(data, dict):
            data = {"rules": data}
        data = {**data, "datapoint_interval": datapoint_interval}
    return load_config(data, source, scrape_interval)


def _read_python(
    text: str, source: str, scrape_interval: float | None, datapoint_interval: str | None
) -> RulesConfig:
    """Pasted SageMaker SDK code; every problem points at its file:line."""
    filename = os.path.basename(source)
    found = sdk.extract(text, filename)
    if found.problems:
        raise ConfigError([Problem(p, m) for p, m in found.problems], source)
    for w in found.warnings:
        print(f"warning: {w}", file=sys.stderr)
    data = found.config
    if datapoint_interval is not None:
        data = {**data, "datapoint_interval": datapoint_interval}
        found.lines.pop("datapoint_interval", None)
    try:
        return load_config(data, source, scrape_interval)
    except ConfigError as e:
        located = [Problem(found.locate(p.path, filename), p.message) for p in e.problems]
        raise ConfigError(located, source) from None


def print_warning(message: str) -> None:
    """How the command-line tools say what a configuration leaves out."""
    print(f"warning: {message}", file=sys.stderr)


def render(
    compiled: Compiled,
    fmt: str,
    generator: str,
    name: str = "trainprof-rules",
    namespace: str | None = None,
    labels: dict[str, str] | None = None,
    warn: Callable[[str], None] | None = None,
) -> str:
    """`compiled` in one of FORMATS; `warn` hears what helm-values could not include."""
    from trainprof.generation import render as r

    if fmt == "rules":
        return r.to_yaml({"groups": compiled.groups}, generator)
    if fmt == "helm-values":
        from trainprof.deploy.chart import helm_values

        return helm_values(compiled, generator, warn)
    return r.to_yaml(r.prometheus_rule(compiled.groups, name, namespace, labels or {}), generator)

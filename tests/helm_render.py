"""Render helm/trainprof with the real helm binary and read the objects back."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parent.parent / "helm" / "trainprof"


class Loader(yaml.SafeLoader):
    """YAML 1.1 reads a bare `=` as the 'value' tag, which SafeLoader cannot build; Kubernetes
    (YAML 1.2) reads a string. The AlertmanagerConfig CRD and matchers hold one."""


Loader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:value"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def helm_env(tmp: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp / "cache"),
        "HELM_CONFIG_HOME": str(tmp / "config"),
        "HELM_DATA_HOME": str(tmp / "data"),
    }


def run_helm(helm: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm, *args], capture_output=True, text=True, env=env, timeout=60)


def render(
    helm: str, env: dict, values: list[str] = (), sets: list[str] = (), chart: Path = CHART
) -> str:
    """`helm template` of `chart`: the chart's directory, or a packaged chart file."""
    args = ["template", "t", str(chart), "--namespace", "monitoring"]
    for v in values:
        args += ["-f", v]
    for s in sets:
        args += ["--set", s]
    result = run_helm(helm, env, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def objects(text: str) -> list[dict]:
    return [d for d in yaml.load_all(text, Loader=Loader) if d]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]

"""Custom rules: a catalog entry written in the configuration, as SageMaker let users write
their own rules.

    rules:
      - custom: SlowMeanStep
        expr: 'max by (training_job) (rate(trainprof_training_step_duration_seconds_sum[5m])
               / rate(trainprof_training_step_duration_seconds_count[5m])) > {threshold}'
        parameters: {threshold: 20}        # defaults; overridable like any rule's
        severity: warning
        description: Mean step time above {threshold} s.
        recommendation: Look at the slowest phase.
        window: 120                        # optional: {window} -> 120 x datapoint_interval
        patience: 60                       # optional: for: 60 x datapoint_interval
        actions: [StopTraining]            # optional, as for any rule

`{name}` placeholders (a bare name in braces, which PromQL never uses) are replaced by
parameter values; the expression so made is checked by promtool's PromQL parser when the
configuration is loaded, so a bad expression is an error with its path, never a rule file
Prometheus refuses. A custom rule is a `RuleSpec` like a built-in one: it is compiled, routed,
drawn in the dashboard (the left side of a top-level `> {parameter}` comparison, against that
parameter), reported and replayed the same way.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainprof.rules.model import (
    NUMBER_UNIT,
    SEVERITIES,
    Alert,
    Build,
    RuleOutput,
    RuleSpec,
    Signal,
    Threshold,
)
from trainprof.rules.params import COUNT, param, scan_interval_param
from trainprof.rules.tensor_params import NUMBER, TEXT

KEYS = (
    "custom",
    "expr",
    "parameters",
    "severity",
    "summary",
    "description",
    "recommendation",
    "window",
    "patience",
    "actions",
)
NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_COMPARISON = re.compile(r"^(?P<left>.*?)\s*(?P<op>>=|<=|>|<)\s*\{(?P<param>\w+)\}\s*$", re.S)
RESERVED = ("window", "patience", "scan_interval_us")


def placeholders(text: str) -> list[str]:
    """The `{name}` placeholders of a template.

    >>> placeholders('rate(x{job="a"}[{window}]) > {threshold}')
    ['window', 'threshold']
    """
    return PLACEHOLDER.findall(text)


def render(template: str, values: Mapping[str, Any]) -> str:
    """A template with its placeholders replaced (numbers written as PromQL reads them)."""

    def value(match: re.Match) -> str:
        v = values[match.group(1)]
        return f"{v:g}" if isinstance(v, float) else str(v)

    return PLACEHOLDER.sub(value, template)


def promql_problem(expr: str, promtool: str | None = None) -> str | None:
    """promtool's complaint about `expr` as an alert expression; None if it parses.

    Raises FileNotFoundError without promtool."""
    promtool = promtool or shutil.which("promtool")
    if promtool is None:
        raise FileNotFoundError("promtool is not installed")
    import yaml

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "custom.rules.yaml"
        group = {"name": "custom", "rules": [{"alert": "Custom", "expr": expr}]}
        path.write_text(yaml.safe_dump({"groups": [group]}))
        done = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30
        )
    if done.returncode == 0:
        return None
    lines = [ln.strip() for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    detail = [ln for ln in lines if "parse error" in ln or "error" in ln.lower()]
    text = (detail or lines or ["promtool refused it"])[-1]
    # promtool prefixes the temporary file's position and group; keep what explains it.
    return text.rpartition("could not parse expression: ")[2]


@dataclasses.dataclass(frozen=True)
class Definition:
    """A custom rule as written in the configuration."""

    name: str
    expr: str
    defaults: Mapping[str, Any]
    severity: str
    summary: str
    description: str
    recommendation: str
    window: int | None
    patience: int | None


def spec_of(d: Definition) -> RuleSpec:
    """The RuleSpec of a custom rule: its own parameters dataclass, build and signals."""
    fields: list[tuple[str, Any, Any]] = []
    for key, default in d.defaults.items():
        kind = NUMBER if isinstance(default, (int, float)) else TEXT
        fields.append((key, Any, param(default, kind, f"Parameter {key} of the expression.")))
    if d.window is not None:
        fields.append(("window", int, param(d.window, COUNT, "Datapoints of {window}.")))
    if d.patience is not None:
        fields.append(("patience", int, param(d.patience, COUNT, "Datapoints before it fires.")))
    fields.append(("scan_interval_us", int, scan_interval_param()))
    parameters = dataclasses.make_dataclass(f"{d.name}Params", fields, frozen=True)
    return RuleSpec(
        name=d.name,
        summary=d.summary,
        detects=f"Custom rule: `{d.expr}`",
        recommendation=d.recommendation,
        severity=d.severity,
        parameters=parameters,
        build=_build(d),
        signals=_signals(d),
        family="custom",
        reads_exporter=False,
        differences="A custom rule of this configuration.",
    )


def _values(b: Build, d: Definition) -> dict[str, Any]:
    values = dataclasses.asdict(b.p)
    if d.window is not None:
        values["window"] = b.span(values["window"], "window")
    return values


def _build(d: Definition) -> Callable[[Build], RuleOutput]:
    def build(b: Build) -> RuleOutput:
        values = _values(b, d)
        for_seconds = 0.0
        if d.patience is not None:
            for_seconds = values["patience"] * b.datapoint_interval
        return RuleOutput(
            alerts=(
                Alert(
                    expr=render(d.expr, values),
                    summary=render(d.summary, values),
                    description=render(d.description, values),
                    for_seconds=for_seconds,
                ),
            )
        )

    return build


def _signals(d: Definition):
    def signals(b: Build, out: RuleOutput, scope: Any, recordings: Any) -> tuple[Signal, ...]:
        values = _values(b, d)
        match = _COMPARISON.match(d.expr)
        if match and isinstance(values.get(match["param"]), (int, float)):
            value = values[match["param"]]
            fires = "above" if match["op"].startswith(">") else "below"
            threshold = Threshold(value, f"{match['param']} = {value:g}", fires)
            expr = render(match["left"], values)
        else:
            threshold, expr = Threshold(0, "condition", "above"), render(d.expr, values)
        return (Signal(d.name, expr, "{{training_job}}", NUMBER_UNIT, threshold),)

    return signals


def definition(
    path: str, item: Mapping[str, Any], problem: Callable[[str, str], None], reserved: set[str]
) -> Definition | None:
    """Check a `custom:` entry; every problem goes to `problem(path, message)`."""
    from trainprof.contract.validation import nearest

    ok = True
    for key in item:
        if key not in KEYS and key != "name":
            problem(f"{path}.{key}", "unknown key" + nearest(str(key), KEYS))
            ok = False
    name = item.get("custom")
    if not isinstance(name, str) or not NAME.match(name):
        problem(
            f"{path}.custom", f"{name!r} is not a rule name (a letter, then letters, digits or _)"
        )
        return None
    if name.lower() in reserved:
        problem(f"{path}.custom", f"{name} is a built-in rule; give the custom rule its own name")
        return None
    expr = item.get("expr")
    if not isinstance(expr, str) or not expr.strip():
        problem(f"{path}.expr", "missing: the PromQL condition of the rule")
        return None
    defaults = item.get("parameters") or {}
    if not isinstance(defaults, Mapping):
        problem(f"{path}.parameters", "expected a mapping of parameter defaults")
        return None
    clean: dict[str, Any] = {}
    for key, value in defaults.items():
        key = str(key)
        if not PLACEHOLDER.fullmatch("{" + key + "}") or key in RESERVED:
            problem(f"{path}.parameters.{key}", "not a usable parameter name")
            ok = False
        elif isinstance(value, bool) or not isinstance(value, (int, float, str)):
            problem(f"{path}.parameters.{key}", f"{value!r} is not a number or a string")
            ok = False
        else:
            clean[key] = float(value) if isinstance(value, (int, float)) else value
    counts = {}
    for key in ("window", "patience"):
        if key in item:
            try:
                counts[key] = COUNT.parse(item[key])
            except ValueError as e:
                problem(f"{path}.{key}", str(e))
                ok = False
    known = set(clean) | set(counts)
    texts = {"expr": expr}
    for key in ("summary", "description", "recommendation"):
        if key in item:
            if not isinstance(item[key], str):
                problem(f"{path}.{key}", "expected text")
                ok = False
            elif key == "summary" and "{{" in item[key]:
                problem(f"{path}.summary", "must be static (no {{ templates }}): use description")
                ok = False
            else:
                texts[key] = item[key]
    for key, text in texts.items():
        for name_used in placeholders(text):
            if name_used not in known:
                problem(
                    f"{path}.{key}",
                    f"{{{name_used}}} is not a parameter"
                    + nearest(name_used, sorted(known))
                    + (f"; parameters: {', '.join(sorted(known))}" if known else ""),
                )
                ok = False
    severity = item.get("severity", "warning")
    if severity not in SEVERITIES:
        problem(f"{path}.severity", f"{severity!r} is not one of {', '.join(SEVERITIES)}")
        ok = False
    if not ok:
        return None
    sample = {**clean, **({"window": "1m"} if "window" in counts else {})}
    try:
        complaint = promql_problem(render(expr, sample))
    except FileNotFoundError:
        complaint = None  # reported as a warning by the loader
    if complaint:
        problem(f"{path}.expr", f"not valid PromQL: {complaint}")
        return None
    description = texts.get("description", f"Custom rule {name} fired.")
    return Definition(
        name=name,
        expr=expr,
        defaults=clean,
        severity=severity,
        summary=texts.get("summary", f"Custom rule {name} fired."),
        description=description,
        recommendation=texts.get("recommendation", ""),
        window=counts.get("window"),
        patience=counts.get("patience"),
    )

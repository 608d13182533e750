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
parameter values, each checked for its place (`trainprof.rules.placeholders`: a label value
is escaped as one, a regex must be RE2's, outside quotes only numbers, names and durations;
no `{{ }}` brought into the description). Numbers are finite: `.inf` would never fire. The
finished expressions and annotations of every custom rule, overrides applied, are checked by
promtool in one run per configuration, Go templates included, so a bad expression or
template is an error with its path, never a rule file Prometheus refuses.

A custom rule is a `RuleSpec` like a built-in one: it is compiled, routed, drawn in the
dashboard (the left side of a top-level `> {parameter}` comparison, against that parameter),
reported and replayed the same way.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainprof.contract.validation import short, template_problem
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
from trainprof.rules.params import COUNT, Kind, _number, param, scan_interval_param
from trainprof.rules.placeholders import (
    PLACEHOLDER,
    misplaced,
    placeholders,
    places,
    render,
    render_promql,
)
from trainprof.rules.tensor_params import NUMBER

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
_COMPARISON = re.compile(r"^(?P<left>.*?)\s*(?P<op>>=|<=|>|<)\s*\{(?P<param>\w+)\}\s*$", re.S)
RESERVED = ("window", "patience", "scan_interval_us")


def _text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{short(value)} is not text")
    return str(value)


# A text parameter: the string as given ("" and "None" too, which the tensor rules' TEXT
# reads as no value and a template would show as None).
TEXT = Kind("text", "", _text, "text")


@dataclasses.dataclass(frozen=True)
class Definition:
    """A custom rule as written in the configuration."""

    path: str  # where it is defined, e.g. rules[0]
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
        check=lambda p: _misplaced(d, dataclasses.asdict(p)),
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
                    expr=render_promql(d.expr, values),
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
            expr = render_promql(match["left"], values)
        else:
            threshold, expr = Threshold(0, "condition", "above"), render_promql(d.expr, values)
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
    refused: set[str] = set()  # named, with a value refused
    for key, value in defaults.items():
        key = str(key)
        if not PLACEHOLDER.fullmatch("{" + key + "}") or key in RESERVED:
            problem(f"{path}.parameters.{key}", "not a usable parameter name")
            ok = False
        elif isinstance(value, bool) or not isinstance(value, (int, float, str)):
            problem(f"{path}.parameters.{key}", f"{short(value)} is not a number or a string")
            ok = False
        elif isinstance(value, str):
            clean[key] = value
        else:
            try:
                clean[key] = _number(value)
            except ValueError as e:  # .inf would compile to `> inf`, which never fires
                problem(f"{path}.parameters.{key}", str(e))
                refused.add(key)
                ok = False
    counts = {}
    for key in ("window", "patience"):
        if key in item:
            try:
                counts[key] = COUNT.parse(item[key])
            except ValueError as e:
                problem(f"{path}.{key}", str(e))
                ok = False
    known = set(clean) | set(counts) | refused
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
    description = texts.get("description", f"Custom rule {name} fired.")
    return Definition(
        path=path,
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


def _misplaced(d: Definition, values: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """(parameter, why its value cannot stand where the expression or the description puts
    it), for the loader to report at the parameter's path."""
    found: dict[str, str] = {}
    for match, place in places(d.expr):
        name = match.group(1)
        problem = misplaced(values[name], place) if name in d.defaults else None
        if problem:
            found.setdefault(name, problem)
    for where, text in (("summary", d.summary), ("description", d.description)):
        for name in placeholders(text):
            value = values.get(name)
            problem = template_problem(value) if isinstance(value, str) else None
            if problem:
                found.setdefault(name, f"{problem} in the {where}")
    return tuple(found.items())


def promtool_problems(
    checked: list[tuple[str, Definition, Mapping[str, Any]]], promtool: str
) -> list[tuple[str, str]]:
    """(path, problem) for each custom rule whose finished expression or annotations
    promtool refuses, all checked in one run. `checked` holds, per rule, where its values
    were set (its definition, or an entry overriding them), its definition and the values.
    """
    import yaml

    groups = []
    for i, (_, d, values) in enumerate(checked):
        values = {**values, **({"window": "1m"} if d.window is not None else {})}
        annotations = {
            "summary": render(d.summary, values),
            "description": render(d.description, values),
            "recommendation": d.recommendation,
        }
        alert = {"alert": "Custom", "expr": render_promql(d.expr, values)}
        groups.append({"name": f"custom{i}", "rules": [{**alert, "annotations": annotations}]})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "custom.rules.yaml"
        path.write_text(yaml.safe_dump({"groups": groups}, allow_unicode=True), encoding="utf-8")
        done = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
        )
    if done.returncode == 0:
        return []
    said = done.stdout + done.stderr
    found = []
    for match in _PROMTOOL_LINE.finditer(said):
        where, d, _ = checked[int(match["group"])]
        key = match["annotation"] or "expr"
        what = "a valid template" if match["annotation"] else "valid PromQL"
        source = f" (with the parameters of {where})" if where != d.path else ""
        found.append((f"{d.path}.{key}", f"not {what}{source}: {match['detail'].strip()}"))
    if not found:  # promtool refused the file as a whole: say what it said
        lines = [ln.strip() for ln in said.splitlines() if ln.strip()]
        found.append((checked[0][1].path, f"promtool refused it: {lines[-1] if lines else ''}"))
    return found


_PROMTOOL_LINE = re.compile(
    r'group "custom(?P<group>\d+)", rule \d+, "Custom": (?:annotation "(?P<annotation>\w+)": '
    r"|could not parse expression: )(?P<detail>.*)"
)

"""SageMaker SDK shapes, so a SageMaker user can paste the rule code they already have.

Two ways in:

* import this module instead of `sagemaker.debugger` and call `to_config`:

      from trainprof.rules.sdk import ProfilerRule, rule_configs, to_config
      rules = [ProfilerRule.sagemaker(rule_configs.ProfilerReport(CPUBottleneck_cpu_threshold=90)),
               ProfilerRule.sagemaker(rule_configs.LowGPUUtilization(),
                                      rule_parameters={"threshold_p95": "70"})]
      to_config(rules)   # {'rules': [{'rule': 'ProfilerReport', 'parameters': {...}}, ...]}

* or hand `trainprof rules compile -c estimator.py` the whole training-launch script:
  `extract` reads the rule calls (and `ProfilerConfig(system_monitor_interval_millis=...)`)
  from its syntax tree without running any of it.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

from trainprof.rules import catalog

_PROFILER_RULES = (catalog.PROFILER_REPORT,) + tuple(r.name for r in catalog.CATALOG)
_ACTIONS = ("ActionList", "StopTraining", "Email", "SMS")


class ProfilerRuleConfig:
    """What `rule_configs.<Rule>(...)` returns: the rule's name and the parameters given."""

    def __init__(self, rule_name: str, **rule_parameters: Any):
        self.rule_name = rule_name
        self.rule_parameters = dict(rule_parameters)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.rule_parameters.items())
        return f"rule_configs.{self.rule_name}({args})"


def _config_factory(name: str):
    spec = catalog.BY_NAME.get(name)
    known = {p.name for p in spec.params} if spec else None

    def factory(**rule_parameters: Any) -> ProfilerRuleConfig:
        if known is not None:
            for key in rule_parameters:
                if key not in known:
                    from trainprof.rules.config import nearest

                    raise TypeError(
                        f"{name}() got an unexpected parameter {key!r}"
                        + nearest(key, sorted(known))
                    )
        return ProfilerRuleConfig(name, **rule_parameters)

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = spec.detects if spec else "All profiler rules, with <Rule>_<param> overrides."
    return factory


class _Action:
    def __init__(self, *args: Any, **kwargs: Any):
        self.args, self.kwargs = args, kwargs


class _RuleConfigs:
    """Stands in for `sagemaker.debugger.rule_configs` (profiler rules only)."""

    def __init__(self):
        for name in _PROFILER_RULES:
            setattr(self, name, _config_factory(name))
        for name in _ACTIONS:
            setattr(self, name, type(name, (_Action,), {}))


rule_configs = _RuleConfigs()


@dataclasses.dataclass
class ProfilerRule:
    """Stands in for `sagemaker.debugger.ProfilerRule`."""

    rule_name: str
    rule_parameters: dict[str, Any]
    name: str | None = None

    @classmethod
    def sagemaker(
        cls,
        base_config: ProfilerRuleConfig,
        name: str | None = None,
        rule_parameters: dict[str, Any] | None = None,
        **_ignored: Any,
    ) -> ProfilerRule:
        """Same signature as the SDK; output paths, images and actions are ignored."""
        if not isinstance(base_config, ProfilerRuleConfig):
            raise TypeError(
                "base_config must come from trainprof.rules.sdk.rule_configs, "
                f"got {type(base_config).__name__}"
            )
        params = {**base_config.rule_parameters, **(rule_parameters or {})}
        return cls(base_config.rule_name, params, name)

    def entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule_name}
        if self.rule_parameters:
            out["parameters"] = dict(self.rule_parameters)
        return out


Rule = ProfilerRule


def to_config(
    rules: list[ProfilerRule | ProfilerRuleConfig], datapoint_interval: str | float | None = None
) -> dict[str, Any]:
    """A trainprof rule configuration (load it with `trainprof.rules.config.load_config`)."""
    entries = []
    for r in rules:
        if isinstance(r, ProfilerRuleConfig):
            r = ProfilerRule.sagemaker(r)
        entries.append(r.entry())
    config: dict[str, Any] = {"rules": entries}
    if datapoint_interval is not None:
        config["datapoint_interval"] = datapoint_interval
    return config


# --- reading pasted code without running it ---------------------------------------------


@dataclasses.dataclass
class Extracted:
    config: dict[str, Any]
    problems: list[tuple[str, str]]  # (path, message)
    warnings: list[str]


def _callee(node: ast.AST) -> str | None:
    """`rule_configs.X` or `X` -> "X"; `a.b.sagemaker` -> "sagemaker"."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _owner(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute):
        return _callee(node.value)
    return None


def extract(source: str, filename: str = "<source>") -> Extracted:
    """Find SageMaker profiler rule configurations in Python source, without executing it.

    Recognises `ProfilerRule.sagemaker(rule_configs.X(...), rule_parameters={...})`,
    `Rule.sagemaker(...)`, bare `rule_configs.X(...)` calls, configs bound to a name first,
    and `ProfilerConfig(system_monitor_interval_millis=N)`.
    """
    problems: list[tuple[str, str]] = []
    warnings: list[str] = []
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as e:
        return Extracted({}, [(f"{filename}:{e.lineno}", f"not valid Python: {e.msg}")], [])

    def where(node: ast.expr | ast.stmt) -> str:
        return f"{filename}:{node.lineno}"

    def literal(node: ast.expr, what: str) -> Any:
        try:
            return ast.literal_eval(node)
        except ValueError:
            problems.append(
                (
                    where(node),
                    f"{what} must be written as a literal (a number, "
                    "string or dict), not computed; trainprof reads this file "
                    "without running it",
                )
            )
            return None

    def rule_config(call: ast.Call) -> tuple[str, dict] | None:
        name = _callee(call.func)
        if name not in _PROFILER_RULES:
            return None
        params = {}
        for kw in call.keywords:
            if kw.arg is None:
                value = literal(kw.value, f"**{ast.unparse(kw.value)}")
                if isinstance(value, dict):
                    params.update(value)
            else:
                value = literal(kw.value, f"{name}({kw.arg}=...)")
                params[kw.arg] = value
        if call.args:
            problems.append((where(call), f"{name}() takes keyword arguments only"))
        return name, params

    bound: dict[str, tuple[str, dict]] = {}
    used_calls: set[int] = set()
    found: list[tuple[int, int, dict[str, Any]]] = []
    datapoint_interval = None

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            cfg = rule_config(node.value)
            if cfg and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                bound[node.targets[0].id] = cfg
                used_calls.add(id(node.value))
                found.append((node.lineno, node.col_offset, {"_bound": node.targets[0].id}))

    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _callee(node.func)
        if name == "ProfilerConfig":
            for kw in node.keywords:
                if kw.arg == "system_monitor_interval_millis":
                    millis = literal(kw.value, "system_monitor_interval_millis")
                    if isinstance(millis, (int, float)) and not isinstance(millis, bool):
                        datapoint_interval = f"{millis:g}ms"
        elif name == "sagemaker" and _owner(node.func) in ("ProfilerRule", "Rule"):
            base = (
                node.args[0]
                if node.args
                else next((kw.value for kw in node.keywords if kw.arg == "base_config"), None)
            )
            cfg = None
            if isinstance(base, ast.Call):
                cfg = rule_config(base)
                used_calls.add(id(base))
                if cfg is None:
                    warnings.append(
                        f"{where(node)}: {ast.unparse(base.func)}() is not a "
                        "profiler rule; skipped (training-health rules are "
                        "not implemented yet)"
                    )
                    continue
            elif isinstance(base, ast.Name) and base.id in bound:
                cfg = bound[base.id]
            else:
                problems.append(
                    (
                        where(node),
                        "the rule passed to .sagemaker() must be a "
                        "rule_configs.<Rule>(...) call or a name bound to one",
                    )
                )
                continue
            params = dict(cfg[1])
            for kw in node.keywords:
                if kw.arg == "rule_parameters":
                    value = literal(kw.value, "rule_parameters")
                    if isinstance(value, dict):
                        params.update(value)
                elif kw.arg == "actions":
                    warnings.append(
                        f"{where(node)}: actions are not compiled into rules; "
                        "see `trainprof actions` for StopTraining"
                    )
            entry: dict[str, Any] = {"rule": cfg[0]}
            if params:
                entry["parameters"] = params
            if isinstance(base, ast.Name):
                found = [f for f in found if f[2].get("_bound") != base.id]
            found.append((node.lineno, node.col_offset, entry))
        elif name in _PROFILER_RULES and id(node) not in used_calls:
            cfg = rule_config(node)
            if cfg:
                entry = {"rule": cfg[0]}
                if cfg[1]:
                    entry["parameters"] = cfg[1]
                found.append((node.lineno, node.col_offset, entry))

    entries = []
    for _, _, entry in sorted(found, key=lambda f: (f[0], f[1])):
        if "_bound" in entry:  # bound to a name but never wrapped: still a rule
            name, params = bound[entry["_bound"]]
            entry = {"rule": name, **({"parameters": params} if params else {})}
        entries.append(entry)
    config: dict[str, Any] = {}
    if datapoint_interval:
        config["datapoint_interval"] = datapoint_interval
    if entries:
        config["rules"] = entries
    elif not problems:
        problems.append(
            (
                filename,
                "no SageMaker profiler rule configuration found (looked "
                "for ProfilerRule.sagemaker(rule_configs.<Rule>(...)) calls)",
            )
        )
    return Extracted(config, problems, warnings)

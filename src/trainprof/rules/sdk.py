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
import math
import re
from typing import Any

from trainprof.contract.validation import nearest
from trainprof.rules.catalog import registry

_ACTIONS = ("ActionList", "StopTraining", "Email", "SMS")


def _snake(name: str) -> str:
    """The SDK's function name of a tensor rule: LossNotDecreasing -> loss_not_decreasing.

    >>> _snake("NLPSequenceRatio"), _snake("StalledTrainingRule")
    ('nlp_sequence_ratio', 'stalled_training_rule')
    """
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


# The SDK names profiler rules in CamelCase (rule_configs.LowGPUUtilization()) and tensor
# rules in snake_case (rule_configs.loss_not_decreasing()); both resolve to catalog names.
_TENSOR_NAMES = [r.name for r in registry.CATALOG if r.family == "health"]
_RULE_NAMES = {
    **{n: n for n in (registry.PROFILER_REPORT,) + tuple(r.name for r in registry.CATALOG)},
    **{_snake(n): n for n in _TENSOR_NAMES},
}
_PROFILER_RULES = tuple(_RULE_NAMES)


class ProfilerRuleConfig:
    """What `rule_configs.<Rule>(...)` returns: the rule's name and the parameters given."""

    def __init__(self, rule_name: str, **rule_parameters: Any):
        self.rule_name = _RULE_NAMES.get(rule_name, rule_name)
        self.rule_parameters = dict(rule_parameters)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.rule_parameters.items())
        return f"rule_configs.{self.rule_name}({args})"


def _config_factory(sdk_name: str):
    name = _RULE_NAMES[sdk_name]
    spec = registry.BY_NAME.get(name)
    known = {p.name for p in spec.params} if spec else None

    def factory(**rule_parameters: Any) -> ProfilerRuleConfig:
        if known is not None:
            for key in rule_parameters:
                if key not in known:
                    raise TypeError(
                        f"{name}() got an unexpected parameter {key!r}"
                        + nearest(key, sorted(known))
                    )
        return ProfilerRuleConfig(name, **rule_parameters)

    factory.__name__ = factory.__qualname__ = sdk_name
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
    actions: tuple[str, ...] = ()

    @classmethod
    def sagemaker(
        cls,
        base_config: ProfilerRuleConfig,
        name: str | None = None,
        rule_parameters: dict[str, Any] | None = None,
        actions: Any = None,
        **_ignored: Any,
    ) -> ProfilerRule:
        """Same signature as the SDK; output paths, images and collections are ignored;
        `actions` (StopTraining, Email, SMS, an ActionList) become the rule's actions."""
        if not isinstance(base_config, ProfilerRuleConfig):
            raise TypeError(
                "base_config must come from trainprof.rules.sdk.rule_configs, "
                f"got {type(base_config).__name__}"
            )
        params = {**base_config.rule_parameters, **(rule_parameters or {})}
        return cls(base_config.rule_name, params, name, _action_names(actions))

    def entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule_name}
        if self.rule_parameters:
            out["parameters"] = dict(self.rule_parameters)
        if self.actions:
            out["actions"] = list(self.actions)
        return out


def _action_names(actions: Any) -> tuple[str, ...]:
    if actions is None:
        return ()
    if not isinstance(actions, _Action):
        raise TypeError(f"actions must come from rule_configs, got {type(actions).__name__}")
    if type(actions).__name__ == "ActionList":
        return tuple(dict.fromkeys(n for a in actions.args for n in _action_names(a)))
    return (type(actions).__name__,)


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
    # Where each part of `config` was written: "rules[1]" or "datapoint_interval" -> line.
    lines: dict[str, int] = dataclasses.field(default_factory=dict)

    def locate(self, path: str, filename: str) -> str:
        """`launch.py:7 (rules[1].parameters.window)` for a configuration path."""
        for prefix, line in self.lines.items():
            if path == prefix or path.startswith((prefix + ".", prefix + "[")):
                return f"{filename}:{line} ({path})"
        return path


# SageMaker Debugger's built-in rules that are not profiler rules (training-health and model
# rules): a pasted script may hold them beside the profiler rules; they are skipped with a
# warning, while a name in neither list is a mistake.
DEBUGGER_RULES = (
    "all_zero",
    "check_input_images",
    "class_imbalance",
    "confusion",
    "create_xgboost_report",
    "dead_relu",
    "exploding_tensor",
    "feature_importance_overweight",
    "loss_not_decreasing",
    "nlp_sequence_ratio",
    "overfit",
    "overtraining",
    "poor_weight_initialization",
    "saturated_activation",
    "similar_across_runs",
    "stalled_training_rule",
    "tensor_variance",
    "tree_depth",
    "unchanged_tensor",
    "vanishing_gradient",
    "weight_update_ratio",
)
# The keyword arguments of the SDK calls read here; anything else is a typo that would lose
# the value it carries.
_SAGEMAKER_ARGS = (
    "base_config",
    "name",
    "container_local_output_path",
    "s3_output_path",
    "rule_parameters",
    "actions",
    "other_trials_s3_input_paths",
    "collections_to_save",
    "instance_type",
    "volume_size_in_gb",
)
_PROFILER_CONFIG_ARGS = (
    "s3_output_path",
    "system_monitor_interval_millis",
    "framework_profile_params",
    "profile_params",
    "disable_profiler",
)
_RULE_CLASSES = ("ProfilerRule", "Rule")
_NOT_LITERAL = (ValueError, TypeError, SyntaxError, RecursionError, MemoryError)


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


def _unparse(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except (RecursionError, ValueError, MemoryError):
        return "<expression>"
    return text if len(text) <= 60 else text[:57] + "..."


def _actions(node: ast.AST, bound: dict[str, ast.AST]) -> list[str] | None:
    """The action names of an `actions=` argument (calls, or names bound to them); None if
    it is not made of actions."""
    calls = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
    out: list[str] = []
    for call in calls:
        if isinstance(call, ast.Name) and call.id in bound:
            call = bound[call.id]
        if not isinstance(call, ast.Call):
            return None
        name = _callee(call.func)
        if name == "ActionList":
            inner = _actions(ast.List(elts=list(call.args)), bound)
            if inner is None:
                return None
            out += inner
        elif name in _ACTIONS:
            out.append(name)
        else:
            return None
    return list(dict.fromkeys(out))


def extract(source: str, filename: str = "<source>") -> Extracted:
    """Find SageMaker profiler rule configurations in Python source, without executing it.

    Recognises `ProfilerRule.sagemaker(rule_configs.X(...), rule_parameters={...})`,
    `Rule.sagemaker(...)`, bare `rule_configs.X(...)` calls, configs bound to a name first,
    and `ProfilerConfig(system_monitor_interval_millis=N)`. A rule name that is not a
    SageMaker rule, or a misspelled keyword of these calls, is a problem at its line.
    """
    try:
        tree = ast.parse(source, filename)
    except SyntaxError as e:
        where = f"{filename}:{e.lineno}" if e.lineno else filename
        return Extracted({}, [(where, f"not valid Python: {e.msg.split(' - ')[0]}")], [])
    except (RecursionError, MemoryError):
        return Extracted({}, [(filename, "nested too deeply to read")], [])
    except ValueError as e:  # a NUL byte
        return Extracted({}, [(filename, f"not valid Python: {e}")], [])
    return _Extractor(filename).run(tree)


class _Extractor:
    def __init__(self, filename: str):
        self.filename = filename
        self.problems: list[tuple[str, str]] = []
        self.warnings: list[str] = []
        self.bound_actions: dict[str, ast.AST] = {}  # names bound to StopTraining() etc.

    def where(self, node: ast.AST) -> str:
        return f"{self.filename}:{getattr(node, 'lineno', 0)}"

    def literal(self, node: ast.AST, what: str) -> Any:
        try:
            return ast.literal_eval(node)
        except _NOT_LITERAL:
            self.problems.append(
                (
                    self.where(node),
                    f"{what} must be written as a literal (a number, "
                    "string or dict), not computed; trainprof reads this file "
                    "without running it",
                )
            )
            return None

    def unknown_keywords(self, call: ast.Call, valid: tuple[str, ...], what: str) -> None:
        for kw in call.keywords:
            if kw.arg is not None and kw.arg not in valid:
                self.problems.append(
                    (
                        self.where(kw.value),
                        f"{what}() has no parameter {kw.arg!r}"
                        + nearest(kw.arg, valid)
                        + "; its value would be lost",
                    )
                )

    def rule_config(self, call: ast.Call, as_base: bool = False) -> tuple[str, dict] | None:
        """(rule name, parameters) of a `rule_configs.X(...)` call, or None if it is not one.

        Names that are not profiler rules are kept when they sit where a rule must be
        (`rule_configs.X` or the base of `.sagemaker`), so the loader names the nearest rule.
        """
        name = _callee(call.func)
        if name is None or name in _ACTIONS:
            return None
        if name in _RULE_NAMES:
            name = _RULE_NAMES[name]
        elif name in DEBUGGER_RULES or not (as_base or _owner(call.func) == "rule_configs"):
            return None
        params = {}
        for kw in call.keywords:
            if kw.arg is None:
                value = self.literal(kw.value, f"**{_unparse(kw.value)}")
                if isinstance(value, dict):
                    params.update(value)
            else:
                params[kw.arg] = self.literal(kw.value, f"{name}({kw.arg}=...)")
        if call.args:
            self.problems.append((self.where(call), f"{name}() takes keyword arguments only"))
        return name, params

    def run(self, tree: ast.AST) -> Extracted:
        bound: dict[str, tuple[str, dict]] = {}
        used_calls: set[int] = set()
        found: list[tuple[int, int, dict[str, Any]]] = []
        datapoint_interval, datapoint_line = None, 0

        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                if _callee(node.value.func) in _ACTIONS:
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            self.bound_actions[target.id] = node.value
                    continue
                if not (len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
                    continue
                cfg = self.rule_config(node.value)
                if cfg:
                    bound[node.targets[0].id] = cfg
                    used_calls.add(id(node.value))
                    found.append((node.lineno, node.col_offset, {"_bound": node.targets[0].id}))

        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name, owner = _callee(node.func), _owner(node.func)
            if name == "ProfilerConfig":
                self.unknown_keywords(node, _PROFILER_CONFIG_ARGS, "ProfilerConfig")
                for kw in node.keywords:
                    if kw.arg == "system_monitor_interval_millis":
                        millis = self.literal(kw.value, "system_monitor_interval_millis")
                        datapoint_interval = _millis(millis)
                        datapoint_line = node.lineno
                        if datapoint_interval is None and millis is not None:
                            self.problems.append(
                                (
                                    self.where(kw.value),
                                    "system_monitor_interval_millis must be a number of "
                                    "milliseconds",
                                )
                            )
            elif name == "sagemaker" and owner not in _RULE_CLASSES:
                if owner is not None and nearest(owner, _RULE_CLASSES):
                    self.problems.append(
                        (
                            self.where(node),
                            f"{_unparse(node.func)}() is not a SageMaker call"
                            + nearest(owner, _RULE_CLASSES).replace("?)", ".sagemaker?)"),
                        )
                    )
            elif name == "sagemaker":
                entry = self.sagemaker_call(node, bound, used_calls)
                if entry is None:
                    continue
                base = node.args[0] if node.args else None
                if isinstance(base, ast.Name):
                    found = [f for f in found if f[2].get("_bound") != base.id]
                found.append((node.lineno, node.col_offset, entry))
            elif id(node) not in used_calls:
                cfg = self.rule_config(node)
                if cfg:
                    entry = {"rule": cfg[0]}
                    if cfg[1]:
                        entry["parameters"] = cfg[1]
                    found.append((node.lineno, node.col_offset, entry))

        entries: list[dict[str, Any]] = []
        lines: dict[str, int] = {}
        for line, _, entry in sorted(found, key=lambda f: (f[0], f[1])):
            if "_bound" in entry:  # bound to a name but never wrapped: still a rule
                name, params = bound[entry["_bound"]]
                entry = {"rule": name, **({"parameters": params} if params else {})}
            lines[f"rules[{len(entries)}]"] = line
            entries.append(entry)
        config: dict[str, Any] = {}
        if datapoint_interval:
            config["datapoint_interval"] = datapoint_interval
            lines["datapoint_interval"] = datapoint_line
        if entries:
            config["rules"] = entries
        elif not self.problems:
            self.problems.append(
                (
                    self.filename,
                    "no SageMaker profiler rule configuration found (looked "
                    "for ProfilerRule.sagemaker(rule_configs.<Rule>(...)) calls)",
                )
            )
        return Extracted(config, self.problems, self.warnings, lines)

    def sagemaker_call(self, node: ast.Call, bound: dict, used_calls: set) -> dict | None:
        """The entry of `ProfilerRule.sagemaker(...)` / `Rule.sagemaker(...)`, or None."""
        self.unknown_keywords(node, _SAGEMAKER_ARGS, _unparse(node.func))
        base = (
            node.args[0]
            if node.args
            else next((kw.value for kw in node.keywords if kw.arg == "base_config"), None)
        )
        if isinstance(base, ast.Call):
            cfg = self.rule_config(base, as_base=True)
            used_calls.add(id(base))
            if cfg is None:
                self.warnings.append(
                    f"{self.where(node)}: {_unparse(base.func)}() is not a "
                    "SageMaker Debugger rule trainprof implements; skipped"
                )
                return None
        elif isinstance(base, ast.Name) and base.id in bound:
            cfg = bound[base.id]
        else:
            self.problems.append(
                (
                    self.where(node),
                    "the rule passed to .sagemaker() must be a "
                    "rule_configs.<Rule>(...) call or a name bound to one",
                )
            )
            return None
        params = dict(cfg[1])
        actions: list[str] | None = []
        for kw in node.keywords:
            if kw.arg == "rule_parameters":
                value = self.literal(kw.value, "rule_parameters")
                if isinstance(value, dict):
                    params.update(value)
                elif value is not None:
                    self.problems.append(
                        (self.where(kw.value), "rule_parameters must be a dict of name: value")
                    )
            elif kw.arg == "actions":
                actions = _actions(kw.value, self.bound_actions)
                if actions is None:
                    self.problems.append(
                        (
                            self.where(kw.value),
                            "actions must be rule_configs.StopTraining(), Email(...), "
                            "SMS(...) or an ActionList of them",
                        )
                    )
        for kw in node.keywords:  # after rule_parameters, which win
            if kw.arg == "collections_to_save":
                self.collections(kw.value, cfg[0], params)
        entry: dict[str, Any] = {"rule": cfg[0]}
        if params:
            entry["parameters"] = params
        if actions:
            entry["actions"] = actions
        return entry

    def collections(self, node: ast.AST, rule: str, params: dict) -> None:
        """`collections_to_save=[CollectionConfig(name=..., parameters={...})]`: the include
        regex of the inputs a rule reads becomes its own regex parameter when the rule's
        parameters do not give one, as the tensors that collection saves are the ones it
        judges (CheckInputImages' `regex`, NLPSequenceRatio's `tokens_regex`)."""
        calls = node.elts if isinstance(node, (ast.List, ast.Tuple)) else [node]
        for call in calls:
            if not (isinstance(call, ast.Call) and _callee(call.func) == "CollectionConfig"):
                self.problems.append(
                    (
                        self.where(call),
                        "collections_to_save must be a list of CollectionConfig(name=..., "
                        "parameters={...}) calls",
                    )
                )
                continue
            self.unknown_keywords(call, ("name", "parameters"), "CollectionConfig")
            given = {kw.arg: kw.value for kw in call.keywords}
            settings = (
                self.literal(given["parameters"], "CollectionConfig(parameters=...)")
                if ("parameters" in given)
                else {}
            )
            if not isinstance(settings, dict):
                self.problems.append(
                    (self.where(call), "CollectionConfig(parameters=...) must be a dict")
                )
                continue
            regex = settings.get("include_regex")
            key = _INPUT_REGEX.get(rule)
            if key is None or not isinstance(regex, str):
                continue
            if key not in params:
                params[key] = regex
            elif params[key] != regex:
                self.warnings.append(
                    f"{self.where(call)}: the collection saves tensors matching {regex!r} "
                    f"but {rule} reads {params[key]!r}; SageMaker's rule would judge none of "
                    "them (trainprof's replay reads both)"
                )


# The rules that read the tensors of a collection configured for them, and the parameter
# naming those tensors.
_INPUT_REGEX = {"CheckInputImages": "regex", "NLPSequenceRatio": "tokens_regex"}


def _millis(value: Any) -> str | None:
    """ "100ms" from 100, or None when `value` is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return f"{float(value):g}ms" if math.isfinite(float(value)) else None
    except OverflowError:
        return None

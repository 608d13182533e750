"""The rules a Prometheus evaluates: what `report --prometheus` judges when `--rules` is not
given, read from /api/v1/rules.

Every alert trainprof compiles carries the labels `rule` (the catalog rule) and
`trainprof_rule_version`; summary rules (OverallSystemUsage, OverallFrameworkMetrics) only
record, in groups named `trainprof.<Rule>`. The report judges those rules, each verdict
derived from the expression and `for:` Prometheus evaluates (its parameters, whatever they
were), with the catalog's defaults for everything else the report shows (thresholds in the
measure column); a note names the rules whose loaded expressions are not the defaults'.

    >>> groups = [{"name": "trainprof.StepOutlier", "interval": 60, "rules": [
    ...     {"type": "alerting", "name": "TrainingStepOutlier", "query": "x > 10",
    ...      "duration": 0, "labels": {"rule": "StepOutlier", "trainprof_rule_version": "1"}}]},
    ...     {"name": "trainprof.state", "interval": 60, "rules": []}]
    >>> loaded_rule_names(groups)
    ['StepOutlier']
    >>> as_compiled(groups)[0]["rules"][0]["alert"], as_compiled(groups)[0]["interval"]
    ('TrainingStepOutlier', '1m')
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainprof.contract.durations import format_duration
from trainprof.contract.names import GROUP_PREFIX, HEALTH_RULE, STATE_RULE, VERSION_LABEL
from trainprof.rules.catalog import BY_NAME
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import RulesConfig, load_config

# trainprof's own alerts about its inputs and the job's state: not rules a report judges.
OWN_RULES = frozenset({HEALTH_RULE, STATE_RULE})


def loaded_rule_names(groups: list[dict[str, Any]]) -> list[str]:
    """The catalog rules the groups hold: by the `rule` label of versioned alerts, and by
    group name (summary rules record only)."""
    names = set()
    for group in groups:
        name = str(group.get("name", ""))
        if name.startswith(GROUP_PREFIX) and name[len(GROUP_PREFIX) :] in BY_NAME:
            names.add(name[len(GROUP_PREFIX) :])
        for rule in group.get("rules") or []:
            labels = rule.get("labels") or {}
            if VERSION_LABEL in labels and labels.get("rule") in BY_NAME:
                names.add(labels["rule"])
    return sorted(names)


def custom_rule_names(groups: list[dict[str, Any]]) -> list[str]:
    """Versioned alerts of rules the catalog does not know (a configuration's custom rules)."""
    return sorted(
        {
            labels["rule"]
            for group in groups
            for rule in group.get("rules") or []
            if VERSION_LABEL in (labels := rule.get("labels") or {})
            and labels.get("rule")
            and labels["rule"] not in BY_NAME
            and labels["rule"] not in OWN_RULES
        }
    )


def as_compiled(groups: list[dict[str, Any]], recordings: bool = False) -> list[dict[str, Any]]:
    """The API's alerting rules (and with `recordings` its recording rules) in the compiler's
    group format (`alert` or `record`, `expr`, `for`, `labels`; `interval` as a duration),
    for deriving verdicts."""
    out = []
    for group in groups:
        rules = []
        for rule in group.get("rules") or []:
            kind = {"alerting": "alert", "recording": "record"}.get(rule.get("type", ""))
            if kind is None or (kind == "record" and not recordings):
                continue
            entry: dict[str, Any] = {
                kind: rule["name"],
                "expr": rule["query"],
                "labels": dict(rule.get("labels") or {}),
            }
            if rule.get("duration"):
                entry["for"] = format_duration(float(rule["duration"]))
            rules.append(entry)
        interval = format_duration(float(group.get("interval") or 60))
        out.append({"name": group.get("name", ""), "interval": interval, "rules": rules})
    return out


def loaded_config(
    groups: list[dict[str, Any]], base: RulesConfig
) -> tuple[RulesConfig | None, list[str]]:
    """`base` (its scrape interval, source, job labels) with the loaded rules, each with the
    catalog's defaults, and notes for people; None when no trainprof rule is loaded."""
    names = loaded_rule_names(groups)
    if not names:
        return None, []
    rules = load_config({"rules": [{"rule": n} for n in names]}, "the loaded rules").rules
    config = dataclasses.replace(base, rules=rules)
    notes = [
        f"the {len(names)} trainprof rules Prometheus evaluates ({', '.join(names)}): "
        "verdicts from its rules, as loaded; --rules FILE judges a configuration instead"
    ]
    defaults = _by_group(compile_rules(config).groups)
    loaded = _by_group(as_compiled(groups, recordings=True))
    differ = sorted(
        name
        for name in names
        if (group := GROUP_PREFIX + name) in loaded
        and group in defaults
        and loaded[group] != defaults[group]
    )
    if differ:
        notes.append(
            f"{', '.join(differ)}: Prometheus evaluates other parameters than the defaults; "
            "the thresholds shown are the defaults' (give --rules FILE for the configuration's)"
        )
    custom = custom_rule_names(groups)
    if custom:
        notes.append(
            f"custom rules {', '.join(custom)} are loaded but not judged: give --rules FILE "
            "with their definitions"
        )
    return config, notes


def _by_group(groups: list[dict[str, Any]]) -> dict[str, set[tuple[str, str, str | None]]]:
    """group name -> its rules as (name, expr, for): the alerts and the recordings of what
    they found, where a rule's parameters are."""
    return {
        group["name"]: {
            (rule.get("alert") or rule["record"], _bare(rule["expr"]), rule.get("for"))
            for rule in group["rules"]
        }
        for group in groups
    }


def _bare(expr: str) -> str:
    """PromQL without whitespace: Prometheus gives back its own layout of an expression."""
    return "".join(expr.split())

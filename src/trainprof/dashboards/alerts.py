"""Queries over Prometheus' own ALERTS series: how often each rule triggered, and its state.

"Times triggered" counts the evaluations at which a rule's alert was firing and had not been
firing one evaluation earlier (its rising edges), per alert instance, summed per rule: what
`trainprof replay` reports as a rule's alerts. The lookback is the rule group's evaluation
interval, the same parameter (`scan_interval_us`) the compiler turns into the group's
`interval`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from trainprof.contract.durations import format_duration
from trainprof.dashboards.queries import RANGE, Scope
from trainprof.rules.config import RuleInstance
from trainprof.rules.promql import Matcher, quote

FIRING, PENDING, OK = 2, 1, 0  # state_now's values


def _rules_regex(instances: Sequence[RuleInstance]) -> str:
    return "|".join(i.spec.name for i in instances)


def times_triggered(
    scope: Scope, instances: Sequence[RuleInstance], over: str = RANGE, by: str = "rule"
) -> str:
    """Per rule (`by`), the rising edges of its firing alerts within `over`; 0 for rules
    that never fired."""
    parts = []
    key = lambda i: i.evaluation_interval  # noqa: E731
    for seconds, group in itertools.groupby(sorted(instances, key=key), key=key):
        rules = _rules_regex(list(group))
        step = format_duration(seconds)
        firing = scope.sel("ALERTS", Matcher("rule", "=~", rules), alertstate="firing")
        parts.append(
            f"sum by ({by}) (count_over_time(({firing} unless {firing} offset {step})"
            f"[{over}:{step}]))"
        )
    return "\nor\n".join(parts + [zeros(instances, by)])


def state_now(scope: Scope, instances: Sequence[RuleInstance], by: str = "rule") -> str:
    """Per rule: 2 firing, 1 pending, 0 neither."""
    rules = Matcher("rule", "=~", _rules_regex(instances))
    firing = scope.sel("ALERTS", rules, alertstate="firing")
    pending = scope.sel("ALERTS", rules, alertstate="pending")
    return (
        f"max by ({by}) ({FIRING} * {firing}\nor\n{PENDING} * {pending})\n"
        f"or\n{zeros(instances, by)}"
    )


def zeros(instances: Sequence[RuleInstance], by: str = "rule") -> str:
    """A 0 per rule, so that rules without alerts still get a row."""
    if by != "rule":
        return "vector(0)"
    return "\nor\n".join(
        f'label_replace(vector(0), "rule", {quote(i.spec.name)}, "", "")' for i in instances
    )


def catalog_rows(instances: Sequence[RuleInstance]) -> str:
    """One series per rule whose labels hold the catalog's text: the rules table's static
    columns, in PromQL so the table needs no other data source."""
    rows = []
    for i in instances:
        expr = "vector(1)"
        for label, text in (
            ("rule", i.spec.name),
            ("severity", i.severity),
            ("description", i.spec.detects),
            ("recommendation", i.spec.recommendation),
        ):
            if "$" in text:
                # Grafana would read it as a variable, label_replace as a group reference.
                raise ValueError(f"rule {i.spec.name}: {label} must not contain '$'")
            expr = f'label_replace({expr}, "{label}", {quote(text)}, "", "")'
        rows.append(expr)
    return "\nor\n".join(rows)

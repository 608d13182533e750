"""What the tensor rules share: the selectors of the training process's reductions, their
one alert, and their one signal drawn against one threshold line.

A tensor rule records nothing and raises one alert (`one_alert`); its dashboard row draws
one series per job and collection against the line of the parameter it compares with
(`threshold_signal`, mostly with `setting`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from trainprof.rules import promql
from trainprof.rules.model import (
    Alert,
    Build,
    Population,
    Recordings,
    RuleOutput,
    RuleSpec,
    Selects,
    Signal,
    Threshold,
    Units,
    percent_threshold,
)

COLLECTIONS = "Collections to watch (comma-separated, smdebug's names); empty for all."
TENSOR_REGEX = (
    "Only tensors matching this regex; they need their own series "
    "(trainprof.torch.watch(include_regex=...)); empty for every tensor."
)
FAMILY = "health"
LEGEND = "{{training_job}} {{collection}}{{mode}}"

Signals = Callable[[Build, RuleOutput, Selects, Recordings], tuple[Signal, ...]]


def tensor_rule(**fields: Any) -> RuleSpec:
    """A rule of the health family: it reads what the training process publishes, never an
    exporter."""
    return RuleSpec(family=FAMILY, reads_exporter=False, **fields)


def one_alert(expr: str, summary: str, description: str, **more: Any) -> RuleOutput:
    """A tensor rule's output: one alert, no recordings."""
    return RuleOutput(alerts=(Alert(expr=expr, summary=summary, description=description, **more),))


# "rank 0" of a query result; RANK_MODE with the mode of a per-mode series.
RANK = "rank {{ .Labels.rank }}"
RANK_MODE = "rank {{ .Labels.rank }} {{ .Labels.mode }}"


def collections(
    series: str, value: str = "{{ .Value }}", what: str = "", worst: str = "highest", **more: str
) -> Units:
    """The watched collections of a job (per-collection reductions of `series`), for a
    per-collection alert's "2 of 5 collections"; a series without a collection label (the
    loss) is named "the loss"."""
    return Units(
        "collection",
        "collection",
        "collections",
        "{{ with .Labels.collection }}{{ . }}{{ else }}the loss{{ end }}",
        Population(series, {"aggregate": "max", **more}, ("collection",)),
        value,
        what,
        worst,
    )


def ranks(
    series: str,
    name: str = RANK,
    what: str = "",
    worst: str = "highest",
    singular: str = "rank",
    plural: str = "ranks",
    **equal: str,
) -> Units:
    """The training processes of a job that publish `series` (one series each, or one per
    mode: `name` says which)."""
    return Units(
        "rank", singular, plural, name, Population(series, equal), "{{ .Value }}", what, worst
    )


# --- selectors ----------------------------------------------------------------------------


def tensor_sel(
    b: Build, series: str, aggregate: str, collections=(), tensor_regex=None, **equal: str
) -> str:
    """A tensor reduction: per-collection aggregates, or per-tensor rows for a regex."""
    b.sel(series)  # must be in the metric contract
    matchers = list(b.matchers)
    if collections:
        matchers.append(
            promql.Matcher("collection", "=~", "|".join(re.escape(c) for c in collections))
        )
    if tensor_regex:
        matchers.append(promql.Matcher("tensor", "=~", tensor_regex))
        aggregate = ""
    return promql.selector(series, matchers, aggregate=aggregate, **equal)


def by_collection(b: Build) -> str:
    return promql.by(tuple(b.job_labels) + ("collection",))


def watched(b: Build, series: str, aggregate: str) -> str:
    """`series` of the tensors the rule watches: its `collection_names` and `tensor_regex`."""
    return tensor_sel(b, series, aggregate, b.p.collection_names, b.p.tensor_regex)


def warn_process_default(b: Build, name: str, default: str, so: str = "") -> None:
    """Parameter `name` is not what the training process computes with by `default`: the
    process must be given the configuration."""
    b.warnings.append(
        f"{b.path(name)} = {getattr(b.p, name)!r}: the training process {default} by "
        f"default; give it this configuration (TRAINPROF_RULES_CONFIG){so}"
    )


def warn_regex(b: Build, name: str, value: str | None) -> None:
    if value:
        b.warnings.append(
            f"{b.path(name)}: {b.rule.name} reads only tensors with their own series; pass "
            f"trainprof.torch.watch(include_regex=...) a regex covering {value!r}"
        )


# --- is the rule's input there ---------------------------------------------------------------

# A selector in compiled PromQL: a metric name and its matchers (quoted values may hold "}").
_SELECTOR = re.compile(r'\b(trainprof_[a-z0-9_]+)(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?')


def input_selectors(expr: str) -> list[str]:
    """The series selectors a tensor rule's alert reads, but for the operand right after an
    `unless`, which only narrows what the others found (LossNotDecreasing's mode choice).

    >>> input_selectors('a_x{m="1"} + trainprof_b{n="}"} unless trainprof_c or trainprof_d')
    ['trainprof_b{n="}"}', 'trainprof_d']
    """
    found = [(m.start(), m.group(0)) for m in _SELECTOR.finditer(expr)]
    narrowing = set()
    for unless in re.finditer(r"\bunless\b", expr):
        after = [start for start, _ in found if start > unless.start()]
        if after:
            narrowing.add(min(after))
    return list(dict.fromkeys(text for start, text in found if start not in narrowing))


def input_present(exprs: list[str], job_labels: tuple[str, ...]) -> str:
    """PromQL with one series per job that has any of the series `exprs` read."""
    by = promql.by(job_labels)
    selectors = [s for e in exprs for s in input_selectors(e)]
    return "\nor\n".join(f"count {by} ({s})" for s in dict.fromkeys(selectors))


# --- what the dashboard row and the report draw --------------------------------------------


def threshold_signal(
    title: str,
    unit: str,
    expr: str | Callable[[Selects], str],
    threshold: Callable[[Any], Threshold],
    **equal: str,
) -> Signals:
    """`signals=` of a rule drawn as one series against one line: `expr` is a series (selected
    in the dashboard's scope, narrowed by `equal`) or a function of the scope; `threshold` a
    function of the rule's parameters."""

    def signals(b: Build, out: RuleOutput, scope: Selects, _: Recordings) -> tuple[Signal, ...]:
        drawn = scope.sel(expr, **equal) if isinstance(expr, str) else expr(scope)
        return (Signal(title, drawn, LEGEND, unit, threshold(b.p)),)

    return signals


def setting(name: str, fires: str, spec: str = "g", suffix: str = "") -> Callable[[Any], Threshold]:
    """The line at the parameter `name`, labelled `name = value` (formatted with `spec`, then
    `suffix`); the suffix "%" draws a percentage as the ratio it is."""

    def threshold(p: Any) -> Threshold:
        value = getattr(p, name)
        if suffix == "%":
            return percent_threshold(name, value, fires)
        return Threshold(value, f"{name} = {value:{spec}}{suffix}", fires)

    return threshold

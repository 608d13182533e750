"""PromQL that folds an exporter's label variants into trainprof's label names.

dcgm-exporter spells one fact several ways across versions and deployments (`UUID`;
`Hostname` then `hostname`; `pod`, the old `pod_name`, and `exported_pod` when the scrape does
not honour the exporter's labels). `coalesce` keeps the first non-empty one:

>>> print(coalesce("m", "node", ("hostname", "Hostname")).replace("), ", "),\\n"))
label_replace(label_replace(m, "node", "$1", "Hostname", "(.+)"),
"node", "$1", "hostname", "(.+)")

`label_replace` only writes when the source label matches `(.+)`, so an empty or absent label
never overwrites a value an earlier-preferred one set: the innermost call is the least
preferred.
"""

from __future__ import annotations

from trainprof.rules.promql import LABEL_NAME


def _replace(expr: str, target: str, source: str, regex: str = "(.+)") -> str:
    for name in (target, source):
        if not LABEL_NAME.match(name):
            raise ValueError(f"not a label name: {name!r}")
    return f'label_replace({expr}, "{target}", "$1", "{source}", "{regex}")'


def coalesce(expr: str, target: str, preferred: tuple[str, ...]) -> str:
    """`expr` with `target` set from the first of `preferred` that is non-empty.

    When none is set, `target` keeps the value `expr` gave it (possibly none). `target` may be
    among `preferred` (the value it already has); unless it is last, its value is first kept
    in `trainprof_kept_<target>`, which the caller aggregates away:

    >>> print(coalesce("m", "node", ("node", "hostname")).replace("), ", "),\\n"))
    label_replace(label_replace(label_replace(m, "trainprof_kept_node", "$1", "node", "(.+)"),
    "node", "$1", "hostname", "(.+)"),
    "node", "$1", "trainprof_kept_node", "(.+)")
    """
    order = [p for p in preferred]
    if target in order[:-1]:
        kept = f"trainprof_kept_{target}"
        expr = _replace(expr, kept, target)
        order[order.index(target)] = kept
    for source in reversed(order):
        if source != target:
            expr = _replace(expr, target, source)
    return expr


def strip_port(expr: str, target: str, source: str) -> str:
    """`target` set from `source` without a trailing `:port` (an `instance` is host:port).

    >>> strip_port("up", "node", "instance")
    'label_replace(up, "node", "$1", "instance", "(.+?)(?::[0-9]+)?")'
    """
    return _replace(expr, target, source, "(.+?)(?::[0-9]+)?")

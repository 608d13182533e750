"""How far back in time the compiled rules and replay's queries read, per input metric.

Replay evaluates a long job in time chunks (trainprof.replay.chunks): each chunk starts a
warm-up before the part it answers for, so every rule's state there is the one a single
pass would have. The warm-up each input metric needs is read off the PromQL itself: a
range selector reads its range (plus any `offset`), an instant selector Prometheus'
5 minute lookback, a subquery its range and one step more; a recording read by another
expression passes the reader's need on to what it reads; an alert adds its `for:` and one
evaluation (its pending state). Anything replay cannot bound this way (an `@` modifier, a
selector by `__name__` regex) makes the reach unbounded: one chunk, as before. An instant
selector of a recording (or ALERTS) reads one evaluation back, not the lookback: the rule
manager writes them at every evaluation and marks an ended series stale.

    >>> selectors("rate(x_total{a=\\"[1m]\\"}[4m10s] offset 45s) / y")
    [('x_total', 295.0), ('y', 300.0)]
    >>> selectors("max_over_time((z > 0)[1m:15s])")
    [('z', 375.0)]
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping

from trainprof.contract.durations import parse_duration

# Prometheus' default lookback of an instant selector (promtool's unit tests keep it).
LOOKBACK = 300.0
UNBOUNDED = math.inf

_TOKEN = re.compile(
    r"""\s+|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`"""  # space and strings
    r"|(?P<dur>\[[^\]]*\])"
    r"|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)"
    r"|(?P<num>(?:[0-9.]+(?:ms|s|m|h|d|w|y))+|[0-9.]+(?:[eE][+-]?[0-9]+)?)"
    r"|(?P<punct>[(){},@]|[^\s\w\"'`(){},@\[\]]+)"
)
# Words that are not series names where a name may stand.
_KEYWORDS = frozenset(
    "by without on ignoring group_left group_right and or unless bool offset inf nan "
    "sum avg min max count stddev stdvar topk bottomk quantile count_values group".split()
)
_GROUPING = frozenset("by without on ignoring group_left group_right".split())


def _tokens(expr: str) -> list[tuple[str, str]]:
    out = []
    for m in _TOKEN.finditer(expr):
        for kind in ("dur", "name", "num", "punct"):
            if m.group(kind) is not None:
                out.append((kind, m.group(kind)))
                break
        else:
            if m.group(0).strip():
                out.append(("str", m.group(0)))
    return out


def _range(text: str) -> tuple[float, float] | None:
    """(range, subquery step or 0) of `[4m10s]` or `[1m:15s]`; None when not a duration."""
    inner = text[1:-1].strip()
    rng, _, step = inner.partition(":")
    try:
        return parse_duration(rng.strip()), parse_duration(step.strip()) if step.strip() else 0.0
    except ValueError:
        return None


def selectors(expr: str, default_step: float = 60.0) -> list[tuple[str | None, float]]:
    """(metric name, seconds back it is read) of each selector in `expr`; name None when
    the selector names no metric, and seconds `UNBOUNDED` when replay cannot bound them."""
    return [(name, back) for name, back, _ in _selectors(expr, default_step)]


def _selectors(expr: str, default_step: float) -> list[tuple[str | None, float, bool]]:
    """selectors(), each with whether it is an instant selector (reading the lookback)."""
    tokens = _tokens(expr)
    out: list[tuple[str | None, float, bool]] = []
    # Stack of open parentheses: (index in `out` where the group's selectors start).
    opened: list[int] = []
    i, n = 0, len(tokens)
    after_grouping = False
    while i < n:
        kind, text = tokens[i]
        if kind == "punct" and text == "@":
            return [(None, UNBOUNDED, False)]
        if kind == "punct" and text == "(":
            opened.append(len(out))
            if after_grouping:
                # `by (a, b)`: label names, not series. Skip to the closing parenthesis.
                depth = 1
                i += 1
                while i < n and depth:
                    depth += tokens[i][1] == "("
                    depth -= tokens[i][1] == ")"
                    i += 1
                opened.pop()
                after_grouping = False
                continue
            i += 1
            continue
        after_grouping = kind == "name" and text in _GROUPING
        if kind == "punct" and text == ")":
            start = opened.pop() if opened else 0
            i += 1
            extra, i = _window_after(tokens, i, default_step, subquery=True)
            if extra is None:
                return [(None, UNBOUNDED, False)]
            if extra:
                out[start:] = [(name, back + extra, inst) for name, back, inst in out[start:]]
            continue
        if kind == "name" and text not in _KEYWORDS:
            if i + 1 < n and tokens[i + 1][1] == "(":
                i += 1  # a function call: its arguments are read as they come
                continue
            name: str | None = text
            i += 1
            if i < n and tokens[i][1] == "{":
                i, by_name = _matchers(tokens, i)
                name = None if by_name else name
            instant = not (i < n and tokens[i][0] == "dur")
            back, i = _window_after(tokens, i, default_step, subquery=False)
            if back is None:
                return [(None, UNBOUNDED, False)]
            out.append((name, back, instant))
            continue
        if kind == "punct" and text == "{":
            i, _ = _matchers(tokens, i)
            back, i = _window_after(tokens, i, default_step, subquery=False)
            out.append((None, UNBOUNDED if back is None else back, False))
            continue
        i += 1
    return out


def _matchers(tokens: list[tuple[str, str]], i: int) -> tuple[int, bool]:
    """The index after `{...}` starting at i, and whether it matches `__name__`."""
    by_name = False
    while i < len(tokens) and tokens[i][1] != "}":
        by_name |= tokens[i][1] == "__name__"
        i += 1
    return i + 1, by_name


def _window_after(
    tokens: list[tuple[str, str]], i: int, default_step: float, subquery: bool
) -> tuple[float | None, int]:
    """Seconds read back by what precedes index i ([range], [range:step], offset), and the
    index after them; None when unbounded. A plain parenthesis reads 0 more."""
    back = 0.0 if subquery else LOOKBACK
    if i < len(tokens) and tokens[i][0] == "dur":
        found = _range(tokens[i][1])
        if found is None:
            return None, i
        rng, step = found
        is_subquery = ":" in tokens[i][1]
        back = rng + ((step or default_step) if is_subquery else 0.0)
        if subquery and not is_subquery:
            return None, i  # a range on a parenthesis is no PromQL replay knows
        i += 1
    if i < len(tokens) and tokens[i] == ("name", "offset"):
        if i + 1 < len(tokens) and tokens[i + 1][0] in ("num", "name"):
            try:
                offset = parse_duration(tokens[i + 1][1])
            except ValueError:
                return None, i
            if offset < 0:
                return None, i
            back += offset
            i += 2
        else:
            return None, i
    if i < len(tokens) and tokens[i][1] == "@":
        return None, i
    return back, i


def subquery_steps(exprs: Iterable[str]) -> set[float]:
    """The explicit steps of every subquery: a chunk's clock must stay on their grid."""
    out = set()
    for expr in exprs:
        for kind, text in _tokens(expr):
            if kind == "dur" and ":" in text:
                found = _range(text)
                if found is not None and found[1]:
                    out.add(found[1])
    return out


def warmups(
    groups: Iterable[Mapping],
    queries: Iterable[str],
    evaluation: float,
    slack: float,
) -> dict[str | None, float]:
    """{input metric: seconds of it a chunk must hold before the part it answers for}
    (None: every metric, when some selector names none). `slack`: seconds added at each
    step, a margin (0: exactly what Prometheus 2.x reads, ranges closed at both ends)."""
    # Each rule's expression and place (group, index): promtool evaluates a group's rules
    # in order, the groups in an order of their own.
    records: dict[str, list[tuple[str, tuple[int, int]]]] = {}
    alerts: list[tuple[str, float, tuple[int, int]]] = []
    for g, group in enumerate(groups):
        for r, rule in enumerate(group["rules"]):
            if "record" in rule:
                records.setdefault(rule["record"], []).append((rule["expr"], (g, r)))
            else:
                alerts.append((rule["expr"], parse_duration(rule.get("for", "0s")), (g, r)))
    need: dict[str | None, float] = {}

    def written_before(places: list[tuple[int, int]], at: tuple[int, int] | None) -> bool:
        """Whether every rule writing a series ran before the reader at the same time:
        a query (at None) runs after them all, a rule after those before it in its group."""
        return at is None or all(p[0] == at[0] and p[1] < at[1] for p in places)

    def read(
        expr: str, before: float, at: tuple[int, int] | None, seen: tuple[str, ...] = ()
    ) -> None:
        for name, back, instant in _selectors(expr, evaluation):
            is_alerts = name in ("ALERTS", "ALERTS_FOR_STATE")
            if instant and (name in records or is_alerts):
                # The rule manager writes its series at every evaluation, and a stale
                # marker when one ends: an instant selector finds them written now, or
                # at the evaluation before when their rule comes later.
                places = (
                    [p for _, _, p in alerts] if is_alerts else [p for _, p in records[name or ""]]
                )
                back += (0.0 if written_before(places, at) else evaluation) - LOOKBACK
            total = before + back + slack
            if is_alerts:
                if "ALERTS" in seen:
                    need[None] = UNBOUNDED  # an alert reading alerts: no bound replay knows
                    return
                for alert_expr, hold, place in alerts:
                    read(alert_expr, total + _held(hold, evaluation), place, (*seen, "ALERTS"))
                continue
            if total <= need.get(name, -1.0):
                continue
            need[name] = total
            if name in records and name not in seen:
                for record_expr, place in records[name]:
                    read(record_expr, total, place, (*seen, name))
            elif name in seen:
                need[None] = UNBOUNDED  # a recording that reads itself

    for expr, hold, place in alerts:
        # Firing at the first evaluation e after the cut needs its condition held since
        # e - `for:` (on the evaluation grid): the condition from `for:` less one
        # evaluation before the cut.
        read(expr, _held(hold, evaluation), place)
    for expr in queries:
        read(expr, 0.0, None)
    return need


def _held(hold: float, evaluation: float) -> float:
    """How long before an evaluation an alert's state there depends on its condition:
    firing at e needs it held at every evaluation from e - `for:` (on the grid), so from
    `for:` less one evaluation before the first evaluation after a cut."""
    return max(0.0, math.ceil(hold / evaluation - 1e-9) * evaluation - evaluation)

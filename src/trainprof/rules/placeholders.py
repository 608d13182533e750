"""The `{name}` placeholders of a custom rule's templates: where each stands, what value may
stand there, and the text made by putting the values in.

A value is never pasted into PromQL as it comes. Inside a quoted string (a label value) any
text goes, escaped as that string's content, and in the string of a `=~` or `!~` matcher it
must be a regular expression Prometheus (RE2) accepts; outside quotes only a finite number, a
metric or label name or a duration, none of which can bring an operator, a parenthesis or a string
into the expression:

    >>> template = 'max(trainprof_tensor_mean_abs{collection="{coll}"}) > {threshold}'
    >>> render_promql(template, {"coll": 'a"} or vector(1) or up{x="', "threshold": 5.0})
    'max(trainprof_tensor_mean_abs{collection="a\\\\"} or vector(1) or up{x=\\\\""}) > 5'
    >>> print(misplaced("5) or vector(1", Place()))
    '5) or vector(1' cannot stand outside quotes in the expression: only a number, a metric or \
label name or a duration can (put the placeholder in quotes for a label value)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from trainprof.contract.validation import regex_problem, short

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_MATCHES_REGEX = re.compile(r"[=!]~\s*$")
# What may stand outside quotes: a metric or label name, a duration or a decimal number.
_BARE = re.compile(
    r"[A-Za-z_:][A-Za-z0-9_:]*|([0-9]+(ms|s|m|h|d|w|y))+|[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)"
    r"([eE][-+]?[0-9]+)?"
)
_NOT_FINITE = re.compile(r"[-+]?(inf|nan)", re.IGNORECASE)


def placeholders(text: str) -> list[str]:
    """The `{name}` placeholders of a template.

    >>> placeholders('rate(x{job="a"}[{window}]) > {threshold}')
    ['window', 'threshold']
    """
    return PLACEHOLDER.findall(text)


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a placeholder stands in an expression."""

    quote: str = ""  # the quote of the string literal it is in: "", '"', "'" or "`"
    regex: bool = False  # in the string of a =~ or !~ matcher
    whole: bool = False  # the string holds the placeholder alone


def places(expr: str) -> list[tuple[re.Match[str], Place]]:
    """Each placeholder of a PromQL template, with where it stands.

    >>> [(m[1], p.quote, p.regex) for m, p in places('x{a="{v}", b=~"{r}.*"} > {t}')]
    [('v', '"', False), ('r', '"', True), ('t', '', False)]
    """
    found: list[tuple[re.Match[str], Place]] = []
    i, n = 0, len(expr)
    while i < n:
        c = expr[i]
        if c == "#":  # a comment runs to the end of the line
            end = expr.find("\n", i)
            end = n if end < 0 else end
            found += [(m, Place()) for m in PLACEHOLDER.finditer(expr, i, end)]
            i = end
        elif c in "\"'`":
            j = i + 1
            while j < n and expr[j] != c:
                j += 2 if c != "`" and expr[j] == "\\" else 1
            regex = _MATCHES_REGEX.search(expr, 0, i) is not None
            for m in PLACEHOLDER.finditer(expr, i + 1, min(j, n)):
                found.append((m, Place(c, regex, m.start() == i + 1 and m.end() == j)))
            i = j + 1
        elif (bare := PLACEHOLDER.match(expr, i)) is not None:
            found.append((bare, Place()))
            i = bare.end()
        else:
            i += 1
    return found


def misplaced(value: Any, place: Place) -> str | None:
    """Why `value` cannot stand at `place` in an expression, or None.

    >>> misplaced('a"} or vector(1) or up{x="', Place('"')) is None  # escaped as a value
    True
    >>> print(misplaced("(?!test)", Place('"', regex=True, whole=True)))
    '(?!test)' uses a negative lookahead (?!...), which Prometheus's regular expressions \
(RE2) do not support
    """
    if isinstance(value, (int, float)):
        return None
    text = str(value)
    if not place.quote:
        if _NOT_FINITE.fullmatch(text):  # `> inf` never fires
            return f"{short(text)} is not a finite number"
        if _BARE.fullmatch(text):
            return None
        return (
            f"{short(text)} cannot stand outside quotes in the expression: only a number, a "
            "metric or label name or a duration can (put the placeholder in quotes for a "
            "label value)"
        )
    if place.quote == "`" and "`" in text:
        return f"{short(text)} holds a backquote, which a `...` string cannot hold"
    if place.regex and place.whole:
        problem = regex_problem(text)
        if problem:
            return f"{short(text)} {problem}"
    return None


def written(value: Any) -> str:
    """A value as a template shows it: numbers as PromQL reads them."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _escaped(text: str, quote: str) -> str:
    """`text` as the content of a PromQL string literal in `quote` (Go's escapes)."""
    if quote == "`":
        return text
    out = []
    for ch in text:
        if ch in ("\\", quote):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def render_promql(template: str, values: Mapping[str, Any]) -> str:
    """An expression with its placeholders replaced: numbers as PromQL reads them, text in a
    string literal escaped as its content (`misplaced` says what may stand elsewhere)."""
    out, position = [], 0
    for match, place in places(template):
        value = written(values[match.group(1)])
        out += [template[position : match.start()], _escaped(value, place.quote)]
        position = match.end()
    return "".join(out) + template[position:]


def render(template: str, values: Mapping[str, Any]) -> str:
    """Annotation text with its placeholders replaced (numbers as PromQL reads them).

    >>> render("Mean step time above {threshold} s.", {"threshold": 20.0})
    'Mean step time above 20 s.'
    """
    return PLACEHOLDER.sub(lambda match: written(values[match.group(1)]), template)

"""Small, safe builders for PromQL text: selectors with escaped label values.

>>> Matcher("training_job", "=", 'a"b').render()
'training_job="a\\\\"b"'
>>> selector("up", [Matcher("job", "=", "trainprof")], quantile="0.95")
'up{job="trainprof", quantile="0.95"}'
"""

from __future__ import annotations

import dataclasses
import re

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def quote(value: str) -> str:
    """A PromQL double-quoted string literal holding exactly `value`."""
    out = []
    for ch in value:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


@dataclasses.dataclass(frozen=True)
class Matcher:
    label: str
    op: str  # = != =~ !~
    value: str

    def render(self) -> str:
        return f"{self.label}{self.op}{quote(self.value)}"


def selector(metric: str, matchers: tuple[Matcher, ...] | list[Matcher] = (), **equal: str) -> str:
    """`metric{...}` with the given matchers, then `label="value"` for each keyword."""
    parts = [m.render() for m in matchers]
    parts += [Matcher(k, "=", v).render() for k, v in equal.items()]
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


def by(labels: tuple[str, ...] | list[str]) -> str:
    """`by (a, b)` clause; `by ()` when empty, which PromQL reads as "aggregate all"."""
    return f"by ({', '.join(labels)})"

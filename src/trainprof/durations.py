"""Durations as people write them and as Prometheus wants them.

>>> parse_duration("0.5s"), parse_duration("4m10s"), parse_duration(15)
(0.5, 250.0, 15.0)
>>> format_duration(250), format_duration(0.5), format_duration(500)
('4m10s', '500ms', '8m20s')
"""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(value: str | int | float) -> float:
    """Seconds from "500ms", "0.5s", "4m10s", "1h" or a bare number of seconds.

    Raises ValueError naming the bad value and showing valid examples.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration (examples: 500ms, 0.5s, 15s, 4m10s)")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip()
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for match in _PART.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNITS[match.group(2)]
                pos = match.end()
            if pos != len(text) or not text:
                raise ValueError(
                    f"{value!r} is not a duration (examples: 500ms, 0.5s, 15s, 4m10s)"
                ) from None
    if seconds != seconds or seconds < 0:
        raise ValueError(f"{value!r} is not a duration: it must be zero or positive")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest Prometheus duration string for `seconds`, to the millisecond.

    Prometheus accepts compound durations (`4m10s`) but no fractions (`0.5s`).
    """
    ms = round(seconds * 1000)
    if ms <= 0:
        return "0s"
    parts = []
    for unit, size in (
        ("w", 604_800_000),
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
        ("ms", 1),
    ):
        count, ms = divmod(ms, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)

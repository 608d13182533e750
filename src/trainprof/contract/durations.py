"""Durations as people write them and as Prometheus wants them.

>>> parse_duration("0.5s"), parse_duration("4m10s"), parse_duration("15s")
(0.5, 250.0, 15.0)
>>> format_duration(250), format_duration(0.5), format_duration(500)
('4m10s', '500ms', '8m20s')
"""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
MAX_SECONDS = 292 * 365 * 86400  # Prometheus durations are int64 nanoseconds
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(value: str | int | float) -> float:
    """Seconds from "500ms", "0.5s", "4m10s" or "1h"; a unit is required, as in Prometheus.

    A bare number is refused rather than guessed: SageMaker counted intervals in
    milliseconds, Prometheus in units it spells out, and `500` read as seconds once
    compiled a 500 ms datapoint into a `for:` of 5d18h53m20s.

    >>> parse_duration(500)
    Traceback (most recent call last):
    ...
    ValueError: 500 has no unit: write 500ms for milliseconds or 500s for seconds

    Raises ValueError naming the bad value and showing valid examples.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{_show(value)} is not a duration (examples: 500ms, 0.5s, 15s, 4m10s)")
    if isinstance(value, int) and abs(value) >= 10**30:
        raise ValueError(f"{_show(value)} is not a duration Prometheus can count")
    text = str(value).strip()
    try:
        number = float(text)
    except (ValueError, OverflowError):
        number = None
    if number is not None:
        if number != number or number in (float("inf"), float("-inf")):
            raise ValueError(f"{_show(value)} is not a finite duration")
        if number < 0:
            raise ValueError(f"{_show(value)} is not a duration: it must be zero or positive")
        if number != 0:
            raise ValueError(
                f"{_show(value)} has no unit: write {text}ms for milliseconds or {text}s "
                "for seconds"
            )
        return 0.0
    pos, seconds = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        seconds += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(
            f"{_show(value)} is not a duration (examples: 500ms, 0.5s, 15s, 4m10s)"
        ) from None
    if not seconds < MAX_SECONDS:
        raise ValueError(f"{_show(value)} is longer than Prometheus can count (292 years)")
    if 0 < seconds < 0.001:
        raise ValueError(f"{_show(value)} is shorter than a millisecond, Prometheus's resolution")
    return seconds


def _show(value: object) -> str:
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else "a huge number"
    return text if len(text) <= 60 else text[:57] + "..."


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

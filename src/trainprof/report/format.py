"""Numbers as the report prints them.

>>> value(0.4567, "percentunit"), value(1, "percentunit"), value(5400, "s")
('45.7%', '100%', '1 h 30 min')
>>> value(2.5e6, "Bps"), axis(2000, "Bps"), value(3.2e9, "bytes")
('2.5 MB/s', '2 kB/s', '3.2 GB')
>>> when(1783677636)
'2026-07-10 10:00:36 UTC'
"""

from __future__ import annotations

import datetime
import math
import unicodedata


def when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )


def short_when(t: float | None, start: float, end: float) -> str:
    """A time inside a report: hours only when the report covers a single UTC day."""
    if t is None:
        return "-"
    same_day = clock(start, True)[:5] == clock(end, True)[:5]
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime(
        "%H:%M:%S" if same_day else "%m-%d %H:%M"
    )


def clock(t: float, with_date: bool = False) -> str:
    fmt = "%m-%d %H:%M" if with_date else "%H:%M"
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime(fmt)


def tick_time(t: float, span: float) -> str:
    """A time axis label, as precise as a chart covering `span` seconds needs."""
    fmt = "%H:%M:%S" if span < 600 else "%m-%d %H:%M" if span > 86400 else "%H:%M"
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime(fmt)


def duration(seconds: float) -> str:
    """A duration people read: 850 ms, 42 s, 11 min 36 s, 2 h 05 min, 3 d 4 h."""
    if seconds != seconds:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms" if seconds >= 0.001 else f"{seconds * 1e6:.0f} µs"
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def number(x: float) -> str:
    if x != x:
        return "-"
    if x == int(x) and abs(x) < 1e15:
        return f"{int(x):,}"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def value(x: float | None, unit: str) -> str:
    """`x` in a Grafana unit: percentunit, s, dtdurations, Bps, a suffix, or a number."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if unit == "percentunit":
        whole = abs(x * 100 - round(x * 100)) < 1e-9
        return f"{x * 100:.0f}%" if whole else f"{x * 100:.1f}%"
    if unit in ("s", "dtdurations"):
        return duration(x)
    if unit == "Bps":
        for size, name in ((1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s")):
            if abs(x) >= size:
                return f"{x / size:.3g} {name}"
        return f"{x:.0f} B/s" if abs(x) >= 10 or x == int(x) else f"{x:.2g} B/s"
    if unit == "bytes":
        for size, name in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if abs(x) >= size:
                return f"{x / size:.3g} {name}"
        return f"{x:.0f} B"
    if unit.startswith("suffix:"):
        return f"{number(x)} {unit.split(':', 1)[1].strip()}"
    return number(x)


def axis(x: float, unit: str) -> str:
    """A short tick label."""
    if unit == "percentunit":
        return f"{x * 100:.0f}%"
    if unit in ("s", "dtdurations"):
        if x == 0:
            return "0"
        return duration(x).replace(" min", "m").replace(" ms", "ms").replace(" s", "s")
    if unit == "Bps":
        return value(x, unit)  # a rate: the axis says "/s"
    return number(x)


_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def visible(text: str) -> str:
    r"""Text with control and format characters shown as escapes: a label value holding a
    tab, a right-to-left override or a zero-width space reads as it is, and cannot reorder
    or hide the text around it.

    >>> visible("a\tb\u202ec")
    'a\\tb\\u202ec'
    """
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if ch.isprintable() or ch == " ":
            out.append(ch)
        elif ch in _NAMED:
            out.append(_NAMED[ch])
        elif unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"):
            code = ord(ch)
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)

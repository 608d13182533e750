"""What replay skipped or corrected in its input, said once per kind with where it was.

A damaged line or file never refuses the whole replay: it is skipped, counted, and named in
the notes with its path and line, so the rest of the job is still replayed.

    >>> d = Damage()
    >>> d.skip("not JSON", "a.json:5")
    >>> d.skip("not JSON", "a.json:9")
    >>> d.notes()
    ['skipped 2 line(s) not JSON: a.json:5, a.json:9']
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

EXAMPLES = 5
# No sampled timestamp is before SageMaker Debugger existed or after 2100.
EARLIEST, LATEST = 946_684_800.0, 4_102_444_800.0  # 2000-01-01, 2100-01-01 UTC
# A gap this long between two samples of one job separates it from an unrelated file (a
# job resubmitted a year later, a stray timestamp of 0): replay keeps the larger part.
MAX_GAP = 6 * 3600.0


@dataclasses.dataclass
class _Kind:
    count: int = 0
    where: list[str] = dataclasses.field(default_factory=list)


class Damage:
    """Counts of skipped or corrected input by kind, with the first few places of each."""

    def __init__(self) -> None:
        self._skipped: dict[str, _Kind] = {}
        self._corrected: dict[str, _Kind] = {}
        self.read: list[str] = []  # "read 4 of a truncated file" sentences

    def skip(self, kind: str, where: str, count: int = 1) -> None:
        self._add(self._skipped, kind, where, count)

    def correct(self, kind: str, where: str, count: int = 1) -> None:
        self._add(self._corrected, kind, where, count)

    @staticmethod
    def _add(table: dict[str, _Kind], kind: str, where: str, count: int) -> None:
        entry = table.setdefault(kind, _Kind())
        entry.count += count
        if len(entry.where) < EXAMPLES and where not in entry.where:
            entry.where.append(where)

    def count(self, kind: str) -> int:
        entry = self._skipped.get(kind) or self._corrected.get(kind)
        return entry.count if entry else 0

    def __bool__(self) -> bool:
        return bool(self._skipped or self._corrected or self.read)

    def notes(self) -> list[str]:
        out = list(self.read)
        for verb, table in (("skipped", self._skipped), ("corrected", self._corrected)):
            for kind, entry in table.items():
                more = entry.count - len(entry.where)
                places = ", ".join(entry.where) + (f" and {more} more" if more > 0 else "")
                noun = "" if kind.startswith(("file", "sample", "step")) else "line(s) "
                out.append(f"{verb} {entry.count} {noun}{kind}: {places}")
        return out


def json_object(
    line: str, where: str, damage: Damage, required: str | None = None
) -> dict[str, Any] | None:
    """The JSON object on one line; None, reported, for a line that is not JSON, not an
    object, or (with `required`) an object without that key.

    >>> d = Damage()
    >>> json_object('{"kind": "host"}', "r.jsonl:1", d, "kind"), json_object("[1]", "s.json:2", d)
    ({'kind': 'host'}, None)
    >>> d.notes()
    ['skipped 1 line(s) not a JSON object: s.json:2']
    """
    try:
        value = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        damage.skip("not JSON", where)
        return None
    if required is not None and (not isinstance(value, dict) or required not in value):
        damage.skip(f"without a {required}", where)
        return None
    if not isinstance(value, dict):
        damage.skip("not a JSON object", where)
        return None
    return value


def ratio(value: float, where: str, damage: Damage, what: str) -> float | None:
    """A utilization ratio as the exporter would serve it: NaN and infinities skipped,
    values outside 0..1 clamped (both reported)."""
    if math.isnan(value) or math.isinf(value):
        damage.skip(f"{what} that is not a number", where)
        return None
    if value < 0 or value > 1:
        damage.correct(f"{what} outside 0..100% (clamped)", where)
        return min(max(value, 0.0), 1.0)
    return value


def timestamp_ok(t: float) -> bool:
    """A finite Unix time between 2000 and 2100."""
    return math.isfinite(t) and EARLIEST <= t <= LATEST


def main_span(times: list[float]) -> tuple[float, float] | None:
    """The (first, last) of the largest run of `times` with no gap over MAX_GAP: the job,
    without a stray file or timestamp far from it."""
    ordered = sorted(times)
    if not ordered:
        return None
    best, start, size, best_size = (ordered[0], ordered[0]), 0, 1, 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] - ordered[i - 1] > MAX_GAP:
            size = i - start
            if size > best_size:
                best, best_size = (ordered[start], ordered[i - 1]), size
            start = i
    return best

"""Interval arithmetic over [start, end) pairs in integer nanoseconds.

    >>> union_length([(0, 10), (5, 20), (30, 40)])
    30
    >>> exclusive_overlap([(0, 10, 0), (5, 20, 1)], 2)
    {1: 5, 3: 5, 2: 10}

`exclusive_overlap` splits time by which classes are active at once: the keys are bit masks
(bit i set when class i runs), each instant counted exactly once.
"""

from __future__ import annotations

from collections.abc import Iterable


def merged(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The disjoint, sorted union of the intervals (empty ones dropped)."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            if end > out[-1][1]:
                out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


def union_length(intervals: Iterable[tuple[int, int]]) -> int:
    return sum(end - start for start, end in merged(intervals))


def intersection_length(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Length of the overlap of two already merged interval lists."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if end > start:
            total += end - start
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def clipped_length(intervals: list[tuple[int, int]], start: int, end: int) -> int:
    """Length of the merged intervals inside [start, end)."""
    return intersection_length(intervals, [(start, end)]) if end > start else 0


def exclusive_overlap(intervals: Iterable[tuple[int, int, int]], classes: int) -> dict[int, int]:
    """Time per set of simultaneously active classes, from (start, end, class) triples."""
    points: list[tuple[int, int, int]] = []
    for start, end, cls in intervals:
        if end > start:
            points.append((start, 1, cls))
            points.append((end, -1, cls))
    points.sort()
    active = [0] * classes
    out: dict[int, int] = {}
    previous = None
    for time, delta, cls in points:
        if previous is not None and time > previous:
            mask = 0
            for i, n in enumerate(active):
                if n:
                    mask |= 1 << i
            if mask:
                out[mask] = out.get(mask, 0) + time - previous
        active[cls] += delta
        previous = time
    return out

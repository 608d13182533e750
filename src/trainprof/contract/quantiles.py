"""Prometheus' `histogram_quantile`, for the exporter's served percentiles and the report.

Both must give exactly what the engine would from the same buckets, so the arithmetic
follows Prometheus 2.42's `bucketQuantile` step by step (same operations, same order).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float:
    """The `q` quantile of cumulative buckets [(upper bound, count)], sorted, +Inf last:
    linear within the bucket the rank falls in; NaN without observations.

    >>> buckets = [(0.0, 0), (0.5, 2), (1.0, 4), (math.inf, 4)]
    >>> histogram_quantile(0.5, buckets), histogram_quantile(0.99, buckets)
    (0.5, 0.99)
    >>> histogram_quantile(0.5, [(1.0, 1), (math.inf, 3)])  # in +Inf: the bound below it
    1.0
    """
    if len(buckets) < 2 or not buckets[-1][1] > 0:
        return math.nan
    rank = q * buckets[-1][1]
    b = next(i for i, (_, count) in enumerate(buckets) if count >= rank or i == len(buckets) - 1)
    if b == len(buckets) - 1:
        return buckets[-2][0]
    end, count = buckets[b]
    if b == 0 and end <= 0:
        return end
    start = 0.0
    if b > 0:
        start, below = buckets[b - 1]
        count -= below
        rank -= below
    return start + (end - start) * (rank / count) if count else math.nan

"""The report's system usage statistics: SageMaker's OverallSystemUsage table (min, p50,
p90, p95, p99, max per node and resource, and per GPU), the job's disk and network totals,
and its initialisation / training loop / finalisation split.

Statistics come from the sampled-ratio histograms, which hold every sample whatever the
scrape interval; quantiles are interpolated as Prometheus' `histogram_quantile` does, and
min and max are known to the bucket (5 % wide), so they are shown as the bucket's bound.

    >>> stats([(0.0, 0), (0.5, 10), (1.0, 20), (math.inf, 20)])["p50"]
    0.5
"""

from __future__ import annotations

import math

from trainprof.contract import metrics as contract
from trainprof.contract.quantiles import histogram_quantile
from trainprof.dashboards.exprs import SYSTEM_USAGE_NAMES
from trainprof.dashboards.queries import RANGE, Scope
from trainprof.sources.gauges import gauges_for

QUANTILES = ("p50", "p90", "p95", "p99")
GPU_HISTOGRAMS = (
    contract.GPU_UTILIZATION_SAMPLED_RATIO,
    contract.GPU_MEMORY_USED_SAMPLED_RATIO,
)
TOTALS = {
    contract.DISK_READ_BYTES_TOTAL: "Disk read",
    contract.DISK_WRITTEN_BYTES_TOTAL: "Disk written",
    contract.NETWORK_RECEIVE_BYTES_TOTAL: "Network received",
    contract.NETWORK_TRANSMIT_BYTES_TOTAL: "Network sent",
}


# A source adapter's per-node gauge of a resource the table pools per node.
_NODE_GAUGE = {
    contract.GPU_UTILIZATION_SAMPLED_RATIO: contract.NODE_GPU_UTILIZATION_SAMPLED_RATIO,
    contract.GPU_MEMORY_USED_SAMPLED_RATIO: contract.NODE_GPU_MEMORY_USED_SAMPLED_RATIO,
}
_STATS = {
    "min": "min_over_time({g}[{r}])",
    "max": "max_over_time({g}[{r}])",
    **{q: f"quantile_over_time({int(q[1:]) / 100:g}, {{g}}[{{r}}])" for q in QUANTILES},
}


def _scraped(gauge: str, by: str, resource: str) -> list[str]:
    """Every statistic of a source adapter's gauge over the report's range, labelled
    `stat`: its scrapes are the samples (no histogram to read)."""
    return [
        f"label_replace(label_replace(max by ({by}) ({expr.format(g=gauge, r=RANGE)}), "
        f'"resource", "{resource}", "", ""), "stat", "{stat}", "", "")'
        for stat, expr in _STATS.items()
    ]


def queries(scope: Scope) -> dict[str, str]:
    """name -> PromQL, each one instant query at the report's end."""
    node_parts, gpu_parts, totals = [], [], []
    adapters = gauges_for(scope.config.source)
    for histogram, name in SYSTEM_USAGE_NAMES.items():
        if histogram in adapters:
            node_gauge = adapters[_NODE_GAUGE.get(histogram, histogram)]
            node_parts += _scraped(scope.sel(node_gauge), "node", name)
            if histogram in GPU_HISTOGRAMS:
                gpu_parts += _scraped(scope.sel(adapters[histogram]), "node, gpu", name)
            continue
        bucket = scope.sel(histogram + "_bucket")
        node_parts.append(
            f'label_replace(sum by (node, le) ({bucket}), "resource", "{name}", "", "")'
        )
        if histogram in GPU_HISTOGRAMS:
            gpu_parts.append(
                f'label_replace(sum by (node, gpu, le) ({bucket}), "resource", "{name}", "", "")'
            )
    for counter, name in TOTALS.items():
        totals.append(
            f"label_replace(sum by (node) (increase({scope.sel(counter)}[{RANGE}])), "
            f'"total", "{name}", "", "")'
        )
    start = scope.sel(contract.TRAINING_START_TIMESTAMP_SECONDS)
    return {
        "usage.node_buckets": "\nor\n".join(node_parts),
        "usage.gpu_buckets": "\nor\n".join(gpu_parts),
        "usage.totals": "\nor\n".join(totals),
        "phases.start": f"min({start})",
        "phases.first_step": f"min({scope.sel('trainprof_training_first_step_timestamp_seconds')})",
        "phases.last_step": f"max({scope.sel('trainprof_training_last_step_timestamp_seconds')})",
    }


def summaries(series) -> dict[tuple[str, ...], dict[str, float]]:
    """{(node, gpu, resource): min, p50, ..., max} of the usage queries' results: computed
    from bucket series (label `le`), or read from a source adapter's (label `stat`)."""
    out = {key: found for key, b in group(series).items() if (found := stats(b)) is not None}
    read: dict[tuple[str, ...], dict[str, float]] = {}
    for labels, points in series:
        if "stat" in labels and points and not math.isnan(points[-1][1]):
            key = (labels.get("node", ""), labels.get("gpu", ""), labels.get("resource", ""))
            read.setdefault(key, {})[labels["stat"]] = points[-1][1]
    out.update({key: found for key, found in read.items() if set(_STATS) <= set(found)})
    return out


def stats(buckets: list[tuple[float, float]]) -> dict[str, float] | None:
    """min, p50, p90, p95, p99 and max of a cumulative histogram [(le, count)]."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    out = {q: histogram_quantile(float(q[1:]) / 100, buckets) for q in QUANTILES}
    previous_le, previous_count = 0.0, 0.0
    low = high = None
    for le, count in buckets:
        if count > previous_count:
            if low is None:
                low = le if le <= 0 else previous_le
            high = previous_le if math.isinf(le) else le
        previous_le, previous_count = le, count
    # A histogram with samples has a bucket that gained some: low and high are set.
    out["min"], out["max"] = low or 0.0, high or 0.0
    return out


def group(series) -> dict[tuple[str, ...], list[tuple[float, float]]]:
    """Bucket series -> {(node, gpu, resource): [(le, count)]}."""
    out: dict[tuple[str, ...], list[tuple[float, float]]] = {}
    for labels, points in series:
        if not points or "le" not in labels:
            continue
        key = (labels.get("node", ""), labels.get("gpu", ""), labels.get("resource", ""))
        out.setdefault(key, []).append((float(labels["le"]), points[-1][1]))
    return out

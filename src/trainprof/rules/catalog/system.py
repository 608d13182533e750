"""OverallSystemUsage: per-node utilization percentiles since the job started (no alert)."""

from __future__ import annotations

from trainprof.contract import metrics as contract
from trainprof.contract.durations import format_duration
from trainprof.rules.model import Build, Recording, RuleOutput, RuleSpec
from trainprof.rules.params import SummaryParams
from trainprof.rules.promql import selector

QUANTILES = contract.USAGE_QUANTILES

# (histogram read, the signal its percentiles are recorded as)
_HISTOGRAMS = (
    (contract.CPU_UTILIZATION_SAMPLED_RATIO,) * 2,
    (contract.CPU_IOWAIT_SAMPLED_RATIO,) * 2,
    (contract.MEMORY_USED_SAMPLED_RATIO,) * 2,
    # The exporter pools every GPU of a host into these, so no `sum without (gpu, uuid)`
    # over a fleet's per-GPU buckets runs at each evaluation.
    (contract.NODE_GPU_UTILIZATION_SAMPLED_RATIO, contract.GPU_UTILIZATION_SAMPLED_RATIO),
    (contract.NODE_GPU_MEMORY_USED_SAMPLED_RATIO, contract.GPU_MEMORY_USED_SAMPLED_RATIO),
)


# The range a source adapter's gauges are summarised over: their samples are not
# accumulated since the job started, and re-reading days of them per node each round would
# cost more than the rules that alert.
SCRAPED_RANGE = "1h"


def _overall_system(b: Build[SummaryParams]) -> RuleOutput:
    recordings = []
    for histogram, signal in _HISTOGRAMS:
        gauge = b.gauge(histogram)
        if gauge is not None:
            recordings += [
                Recording(
                    "node",
                    signal,
                    "quantile",
                    f"quantile_over_time({q:g}, {gauge}[{SCRAPED_RANGE}])",
                    {"quantile": f"{q:g}"},
                )
                for q in QUANTILES
            ]
            continue
        # The exporter serves histogram_quantile() of its cumulative buckets (the
        # distribution since it started): one series per node and quantile is read instead
        # of every bucket series of every node for each quantile.
        served = contract.usage_quantiles_of(histogram)
        recordings += [
            Recording(
                "node", signal, "quantile", b.sel(served, quantile=f"{q:g}"), {"quantile": f"{q:g}"}
            )
            for q in QUANTILES
        ]
    span = format_duration(max(60.0, 4 * b.scrape_interval))
    for direction in ("receive", "transmit"):
        counter = f"trainprof_network_{direction}_bytes_total"
        rate = f"sum without (device) (rate({b.sel(counter)}[{span}]))"
        if b.host_source == "node_exporter":
            rate = (
                f"{selector('node:trainprof_node_job:info', b.matchers)}\n* on (node) group_left\n"
                f"node:trainprof_network_{direction}_bytes:rate"
            )
        recordings.append(
            Recording("node", f"trainprof_network_{direction}_bytes", f"rate{span}", rate)
        )
    return RuleOutput(tuple(recordings), ())


OVERALL_SYSTEM_USAGE = RuleSpec(
    name="OverallSystemUsage",
    summary="Per-node system usage percentiles (no alert)",
    detects=(
        "Recording rules for the report and the dashboards: per node, the 50th, 95th and "
        "99th percentiles since the exporter started of CPU utilization, I/O wait, host "
        "memory, GPU utilization and GPU memory (all GPUs of the node pooled), and the "
        "network throughput."
    ),
    recommendation=(
        "Compare the nodes: one node far from the others points at a hardware or placement "
        "problem; every node low points at a job that could use fewer or smaller machines."
    ),
    severity="info",
    parameters=SummaryParams,
    build=_overall_system,
    family="system",
    alerting=False,
    differences=(
        "Percentiles come from the exporter's histograms (buckets of 1, 2 and then 5 %) "
        "instead of the exact sample values; the exporter serves them beside each histogram "
        "(`trainprof_*_quantile_ratio`, computed as `histogram_quantile` would), so a fleet's "
        "rules read one series per node and percentile instead of every bucket. GPU "
        "percentiles pool every sample of every GPU of the node; the original took the "
        "percentiles of the per-sample average over GPUs. Network is a "
        "rate in bytes per second, not the percentiles of per-sample values; minimum and "
        "maximum are not recorded. With dcgm-exporter or node_exporter as the source, the "
        "percentiles are those of the scraped values over the last hour, and the node's GPU "
        "series is the mean over its GPUs at each scrape, as in the original."
    ),
)

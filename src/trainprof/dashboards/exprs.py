"""The queries behind the job dashboard's panels, shared with the HTML report.

Each function returns PromQL narrowed by the scope's variables; the dashboard puts it in a
panel, the report evaluates it (against Prometheus, or over a replay through promtool), so a
number in the report is the number on the dashboard. Recordings are looked up by metric and
level in the compiled configuration, whichever rule writes them; a MissingRecording when none
does.
"""

from __future__ import annotations

from trainprof.contract import metrics as contract
from trainprof.contract.names import JOB_LABEL, RECORDED_INITIALIZATION, RECORDED_PHASE
from trainprof.dashboards.queries import RANGE, RATE_INTERVAL, Scope
from trainprof.rules.compiler import Compiled
from trainprof.sources.gauges import gauges_for

# OverallSystemUsage's histograms, as the report's table names them.
SYSTEM_USAGE_NAMES = {
    contract.CPU_UTILIZATION_SAMPLED_RATIO: "CPU utilization",
    contract.CPU_IOWAIT_SAMPLED_RATIO: "I/O wait",
    contract.MEMORY_USED_SAMPLED_RATIO: "Host memory",
    contract.GPU_UTILIZATION_SAMPLED_RATIO: "GPU utilization",
    contract.GPU_MEMORY_USED_SAMPLED_RATIO: "GPU memory",
}
QUANTILES = ("0.5", "0.95", "0.99")
STEP_QUANTILES = ("0.5", "0.9", "0.99")
GPU_LEGEND = "{{node}} GPU {{gpu}}"


def gauge(scope: Scope, histogram: str) -> str | None:
    """The per-job gauge a source adapter serves `histogram`'s signal as (the configuration's
    `source`), narrowed by the scope; None when trainprof's exporter serves the histogram."""
    name = gauges_for(scope.config.source).get(histogram)
    return scope.sel(name) if name else None


def mean(scope: Scope, histogram: str, by: str = "", over: str = RATE_INTERVAL) -> str:
    """Mean of a sampled-ratio histogram over `over`: every sample counts (every scrape, for
    a source adapter's gauge)."""
    g = gauge(scope, histogram)
    if g is not None:
        avg = f"avg_over_time({g}[{over}])"
        return f"avg by ({by}) ({avg})" if by else avg
    total = f"rate({scope.sel(histogram + '_sum')}[{over}])"
    count = f"rate({scope.sel(histogram + '_count')}[{over}])"
    if by:
        return f"sum by ({by}) ({total})\n/\nsum by ({by}) ({count})"
    return f"{total}\n/\n{count}"


# --- training job summary --------------------------------------------------------------------


def start_ms(scope: Scope) -> str:
    return f"min({scope.sel('trainprof_training_start_timestamp_seconds')}) * 1000"


def initialization(scope: Scope, compiled: Compiled) -> str:
    rec = compiled.recording(RECORDED_INITIALIZATION, level=JOB_LABEL)
    return scope.sel(rec.record)


def elapsed(scope: Scope) -> str:
    """From start to the latest scrape; without the training API, how long the exporters
    have sampled."""
    s = scope.sel
    start = s(contract.TRAINING_START_TIMESTAMP_SECONDS)
    sampled = (
        f"max(\n  {s('trainprof_samples_total')}\n  * on (instance, job)\n  "
        f"{s('trainprof_sampler_interval_seconds')}\n)"
    )
    return f"(max(timestamp({start})) - min({start}))\nor\n{sampled}"


def steps_by_mode(scope: Scope) -> str:
    return f"sum by (mode) ({scope.sel('trainprof_training_steps_total')})"


def job_mean(scope: Scope, histogram: str, over: str = RATE_INTERVAL) -> str:
    """The job's mean of a sampled ratio over `over`: every sample of all its nodes (or
    GPUs) pooled, one series; a source adapter's gauge averaged."""
    g = gauge(scope, histogram)
    if g is not None:
        return f"avg(avg_over_time({g}[{over}]))"
    total = f"rate({scope.sel(histogram + '_sum')}[{over}])"
    count = f"rate({scope.sel(histogram + '_count')}[{over}])"
    return f"sum({total})\n/\nsum({count})"


def step_mean(scope: Scope, over: str = RATE_INTERVAL) -> str:
    """The job's mean step duration over `over`, every rank's steps."""
    total = scope.sel(contract.TRAINING_STEP_DURATION_SECONDS + "_sum")
    count = scope.sel(contract.TRAINING_STEP_DURATION_SECONDS + "_count")
    return f"sum(rate({total}[{over}]))\n/\nsum(rate({count}[{over}]))"


def step_rate(scope: Scope, by: str = "", over: str = RATE_INTERVAL) -> str:
    rate = f"rate({scope.sel('trainprof_training_steps_total')}[{over}])"
    return f"sum by ({by}) ({rate})" if by else f"sum({rate})"


def firing_alerts(scope: Scope) -> str:
    return scope.sel("ALERTS", alertstate="firing")


def node_series(scope: Scope, training_api: bool = True) -> str:
    """Series each node of a job serves while it runs: trainprof's exporter's, the source
    adapters' per-job gauges, and (with `training_api`) the training API's."""
    s = scope.sel
    parts = [s(contract.SAMPLES_TOTAL)]
    adapters = gauges_for(scope.config.source)
    for histogram in (
        contract.CPU_UTILIZATION_SAMPLED_RATIO,
        contract.NODE_GPU_UTILIZATION_SAMPLED_RATIO,
    ):
        if histogram in adapters:
            parts.append(s(adapters[histogram]))
    if training_api:
        parts.append(s(contract.TRAINING_STEPS_TOTAL))
    return " or ".join(parts)


def node_count(scope: Scope) -> str:
    return f"count(count by (node) ({node_series(scope)}))"


def gpu_count(scope: Scope) -> str:
    g = gauge(scope, contract.GPU_UTILIZATION_SAMPLED_RATIO)
    return f"count({g or scope.sel('trainprof_gpu_utilization_sampled_ratio_count')})"


def rank_count(scope: Scope) -> str:
    return f"count(count by (rank) ({scope.sel('trainprof_training_steps_total')}))"


# --- system usage ----------------------------------------------------------------------------


def network(scope: Scope, compiled: Compiled, direction: str) -> str:
    rec = compiled.recording(f"trainprof_network_{direction}_bytes", level="node")
    return scope.sel(rec.record)


def system_usage_quantile(scope: Scope, compiled: Compiled, q: str) -> str:
    """OverallSystemUsage's q-quantile of every resource, one series per node and resource
    (label `resource`)."""
    parts = []
    for histogram, name in SYSTEM_USAGE_NAMES.items():
        rec = compiled.recording(histogram, level="node", operation="quantile", quantile=q)
        parts.append(
            f'label_replace({scope.sel(rec.record, quantile=q)}, "resource", "{name}", "", "")'
        )
    return "\nor\n".join(parts)


def gpu_busy_seconds(scope: Scope, over: str = RANGE) -> str:
    """Seconds a kernel ran on each GPU: utilization summed over the samples x interval."""
    s = scope.sel
    g = gauge(scope, contract.GPU_UTILIZATION_SAMPLED_RATIO)
    if g is not None:
        return f"sum_over_time({g}[{over}]) * {scope.config.scrape_interval:g}"
    return (
        f"increase({s('trainprof_gpu_utilization_sampled_ratio_sum')}[{over}])\n"
        f"* ignoring (gpu, uuid) group_left\n{s('trainprof_sampler_interval_seconds')}"
    )


def cpu_busy_seconds(scope: Scope, over: str = RANGE) -> str:
    """Core-seconds the CPUs were busy."""
    s = scope.sel
    g = gauge(scope, contract.CPU_UTILIZATION_SAMPLED_RATIO)
    if g is not None:
        return (
            f"sum_over_time({g}[{over}]) * {scope.config.scrape_interval:g}\n"
            "* on (node) group_left\ncount by (node) (cpu:trainprof_cpu_utilization:ratio)"
        )
    # The three series come from one exporter with the same labels: plain one-to-one `*`.
    return (
        f"increase({s('trainprof_cpu_utilization_sampled_ratio_sum')}[{over}])\n"
        f"* {s('trainprof_sampler_interval_seconds')}\n* {s('trainprof_cpu_cores')}"
    )


# --- framework metrics -----------------------------------------------------------------------


def step_buckets(scope: Scope, over: str) -> str:
    buckets = scope.sel(contract.TRAINING_STEP_DURATION_SECONDS + "_bucket")
    return f"sum by (le) (increase({buckets}[{over}]))"


def step_quantile(scope: Scope, q: str, by: str = "mode") -> str:
    buckets = scope.sel(contract.TRAINING_STEP_DURATION_SECONDS + "_bucket")
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({buckets}[{RATE_INTERVAL}])))"


def job_phase_share(scope: Scope, compiled: Compiled) -> str:
    rec = compiled.recording(RECORDED_PHASE, level="training_job_phase")
    return scope.sel(rec.record)


def rank_phase_share(scope: Scope, compiled: Compiled) -> str:
    rec = compiled.recording(RECORDED_PHASE, level="rank_phase")
    return scope.sel(rec.record)


def job_mode_share(scope: Scope, compiled: Compiled) -> str:
    rec = compiled.recording(contract.TRAINING_STEP_DURATION_SECONDS, level="training_job_mode")
    return scope.sel(rec.record)


def dataloader_share(scope: Scope, by: str = "rank") -> str:
    phase = scope.sel(contract.TRAINING_PHASE_SECONDS_TOTAL)
    dataloader = scope.sel(contract.TRAINING_PHASE_SECONDS_TOTAL, phase="dataloader")
    return (
        f"sum by ({by}) (rate({dataloader}[{RATE_INTERVAL}]))\n/\n"
        f"sum by ({by}) (rate({phase}[{RATE_INTERVAL}]))"
    )


def phase_seconds(scope: Scope, over: str = RANGE) -> str:
    phase = scope.sel(contract.TRAINING_PHASE_SECONDS_TOTAL)
    return f"sum by (phase) (increase({phase}[{over}]))"


def phase_seconds_per_step(scope: Scope, over: str = RANGE) -> str:
    steps = scope.sel(contract.TRAINING_STEPS_TOTAL)
    return (
        f"{phase_seconds(scope, over)}\n/ ignoring (phase) group_left\n"
        f"sum(increase({steps}[{over}]))"
    )

"""Per-job gauges the rules read when a source adapter, not trainprof's exporter, serves a
signal: one sample per scrape instead of trainprof's 0.5 s samples.

Each is the normalised device or host recording joined to the jobs using it, so it carries
`node` (and `gpu`, `uuid`) plus the job labels, like trainprof's own series. Their names are
what `GAUGES` maps each of trainprof's sampled histograms to:

>>> GAUGES["trainprof_gpu_utilization_sampled_ratio"]
'gpu_job:trainprof_gpu_utilization:ratio'

All are recorded at every scrape but dcgm's framebuffer gauges, recorded once a minute with
the job maps (`dcgm.job_recordings`) for dashboards, the report and OverallSystemUsage: the
rules read dcgm-exporter's own framebuffer samples instead (`from_samples`).
"""

from __future__ import annotations

from collections.abc import Callable

from trainprof.contract import metrics as contract
from trainprof.rules.promql import Matcher, selector
from trainprof.sources import dcgm
from trainprof.sources.node_exporter import BUSIEST_CORE as NODE_BUSIEST_CORE
from trainprof.sources.node_exporter import NODE_CPU
from trainprof.sources.options import SourceOptions

# trainprof's sampled histogram -> (the source serving it, its per-job gauge)
GPU_GAUGES = {
    contract.GPU_UTILIZATION_SAMPLED_RATIO: dcgm.UTILIZATION_GAUGE,
    contract.GPU_MEMORY_USED_SAMPLED_RATIO: dcgm.MEMORY_GAUGE,
    # SageMaker's node-level GPU series: the mean over the node's GPUs at each sample.
    contract.NODE_GPU_UTILIZATION_SAMPLED_RATIO: "node_job:trainprof_gpu_utilization:ratio",
    contract.NODE_GPU_MEMORY_USED_SAMPLED_RATIO: "node_job:trainprof_gpu_memory_used:ratio",
}
HOST_GAUGES = {
    contract.CPU_UTILIZATION_SAMPLED_RATIO: "node_job:trainprof_cpu_utilization:ratio",
    contract.CPU_IOWAIT_SAMPLED_RATIO: "node_job:trainprof_cpu_iowait:ratio",
    contract.MEMORY_USED_SAMPLED_RATIO: "node_job:trainprof_memory_used:ratio",
}
GAUGES = {**GPU_GAUGES, **HOST_GAUGES}
# The busiest core of a node at each scrape (the bottleneck rules' "a core above").
BUSIEST_CORE = {
    "cpu": "node_job:trainprof_cpu_core_utilization:max",
    "iowait": "node_job:trainprof_cpu_core_iowait:max",
}


def gauges_for(source: tuple[str, ...]) -> dict[str, str]:
    """The sampled histograms a `source` setting serves as per-job gauges, with their names.

    >>> sorted(gauges_for(("node_exporter",)).values())[:1]
    ['node_job:trainprof_cpu_iowait:ratio']
    >>> gauges_for(("trainprof",))
    {}
    """
    return {
        **(GPU_GAUGES if "dcgm" in source else {}),
        **(HOST_GAUGES if "node_exporter" in source else {}),
    }


# Each job's nodes an adapter served at this scrape: summed over a range, a rule's datapoints.
NODE_SCRAPES = "training_job:trainprof_node_scrapes:count"


def node_scrapes(sources: tuple[str, ...], options: SourceOptions) -> dict[str, str]:
    """`NODE_SCRAPES`: one series per job, so counting a long job's scrapes reads one
    sample per scrape, not one per node and scrape."""
    served = [
        gauge
        for source, gauge in (
            ("node_exporter", HOST_GAUGES[contract.CPU_UTILIZATION_SAMPLED_RATIO]),
            ("dcgm", GPU_GAUGES[contract.NODE_GPU_UTILIZATION_SAMPLED_RATIO]),
        )
        if source in sources
    ]
    union = "\n  or\n  ".join(served)
    return {
        "record": NODE_SCRAPES,
        "expr": f"count by ({', '.join(options.job_labels)}) (\n  {union}\n)",
    }


def gpu_recordings(options: SourceOptions, metric: str) -> dict[str, str]:
    """SageMaker's node-level GPU series from dcgm's per-job GPU gauges: the mean over the
    node's GPUs (`metric`: utilization, at each scrape; memory_used, once a minute)."""
    jl = ", ".join(options.job_labels)
    return {
        "record": f"node_job:trainprof_gpu_{metric}:ratio",
        "expr": f"avg by (node, {jl}) (gpu_job:trainprof_gpu_{metric}:ratio)",
    }


# The gauge whose samples count a GPU's scrapes, for a gauge recorded less often.
SCRAPES_OF = {GPU_GAUGES[contract.GPU_MEMORY_USED_SAMPLED_RATIO]: dcgm.UTILIZATION_GAUGE}


def from_samples(
    gauge: str,
    over_time: Callable[[str], str],
    job_labels: tuple[str, ...],
    matchers: tuple[Matcher, ...] = (),
) -> str:
    """`over_time` of the per-job `gauge` for a rule: on the source's own samples where the
    gauge is not recorded at every scrape (`dcgm.from_samples`), else on the gauge.

    >>> from_samples(GAUGES["trainprof_cpu_utilization_sampled_ratio"],
    ...              lambda s: f"avg_over_time({s}[1m])", ("job",))
    'avg_over_time(node_job:trainprof_cpu_utilization:ratio[1m])'
    """
    raw = dcgm.from_samples(gauge, over_time, job_labels, matchers)
    return raw if raw is not None else over_time(selector(gauge, matchers))


def host_recordings(options: SourceOptions) -> list[dict[str, str]]:
    """node_exporter's per-node figures (`node_exporter.recordings`) per job on the node
    (after `node:trainprof_node_job:info`), which carries the job labels."""

    def per_job(record: str, host: str) -> dict[str, str]:
        return {
            "record": record,
            "expr": f"node:trainprof_node_job:info\n* on (node) group_left\n{host}",
        }

    return [
        per_job(HOST_GAUGES[contract.CPU_UTILIZATION_SAMPLED_RATIO], NODE_CPU["utilization"]),
        per_job(HOST_GAUGES[contract.CPU_IOWAIT_SAMPLED_RATIO], NODE_CPU["iowait"]),
        per_job(
            HOST_GAUGES[contract.MEMORY_USED_SAMPLED_RATIO], "node:trainprof_memory_used:ratio"
        ),
        per_job(BUSIEST_CORE["cpu"], NODE_BUSIEST_CORE["utilization"]),
        per_job(BUSIEST_CORE["iowait"], NODE_BUSIEST_CORE["iowait"]),
    ]

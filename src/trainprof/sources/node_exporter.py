"""Recording rules that turn node_exporter's host counters into trainprof's ratios.

A core's utilization is psutil's (and so SageMaker's and trainprof's exporter's): the share
of its time in any mode but `idle` and `iowait`; `iowait` is its own share. node_exporter
serves counters, so each scrape contributes one sample: `irate` over the last two scrapes is
the core's average over that scrape interval (a 0.5 s sampler sees the peaks it smooths).
Every output carries `node` (from the configured label) and, per core, `cpu`.

`node_cpu_seconds_total` (a series per core and mode, 512 on a 64-core host) is the largest
input of the group and costs about as much per series as everything else the group reads.
A core's modes add up to the time that passed (/proc/stat counts each core's every tick in
exactly one mode), so the shares are the rates themselves and only the `idle` and `iowait`
counters are read: a quarter of the series, each once. `iowait`'s share is recorded first;
the busy share is 1 minus the `idle` rate minus that recording, in the same group and so at
the same instant. node_exporter on Linux serves both modes for every core; a core without
`iowait` would have no busy share, and a node without it raises TrainprofRuleInputMissing.
Reading a recorded series costs Prometheus a fifth of taking a counter's rate (about 2
against 10 us at 1,000 nodes x 64 cores), so this beats taking the `iowait` rate a second
time, and beats recording the two rates first (four series per core written at every
scrape where two suffice).
The price is the scrape's timing jitter: Prometheus divides by the interval between its
scrapes' timestamps, node_exporter read the counters a few milliseconds after each, so a
share can be off by that jitter over the interval (0.1 % for 15 ms in 15 s); the ratios are
clamped to 0..1.
"""

from __future__ import annotations

from trainprof.contract.durations import format_duration
from trainprof.sources.labels import coalesce, strip_port
from trainprof.sources.options import SourceOptions


def on_node(metric: str, options: SourceOptions) -> str:
    """`metric` with its node name in `node`."""
    if options.node_label == "instance":
        return strip_port(metric, "node", "instance")
    if options.node_label == "node":
        return metric
    return coalesce(metric, "node", (options.node_label,))


def cpu_seconds(mode: str, options: SourceOptions) -> str:
    """Per core: the seconds per second spent in `mode`.

    The node label is set on the rates, not the selectors: a range needs a bare selector.
    `max`, not `sum`: a node_exporter scraped by two jobs serves each core's counter twice,
    and a sum would count its time twice.

    >>> cpu_seconds("iowait", SourceOptions())
    'max by (node, cpu) (irate(node_cpu_seconds_total{mode="iowait"}[45s]))'
    """
    w = format_duration(3 * options.scrape_interval)
    rates = on_node(f'irate(node_cpu_seconds_total{{mode="{mode}"}}[{w}])', options)
    return f"max by (node, cpu) ({rates})"


# Per node, from its cores: the mean share and the busiest core's, what the rules read. Every
# recording here is per core or per node, with no job label: a Prometheus that scrapes a
# share of the nodes can record them (trainprof.sources.tiers).
NODE_CPU = {
    "utilization": "node:trainprof_cpu_utilization:ratio",
    "iowait": "node:trainprof_cpu_iowait:ratio",
}
BUSIEST_CORE = {
    "utilization": "node:trainprof_cpu_core_utilization:max",
    "iowait": "node:trainprof_cpu_core_iowait:max",
}


def recordings(options: SourceOptions) -> list[dict[str, str]]:
    """Per core, then per node: the shares, memory, disk and network figures and I/O
    pressure, each under `node` (and `cpu`).

    >>> [r["record"] for r in recordings(SourceOptions())][:6]
    ['cpu:trainprof_cpu_iowait:ratio', 'cpu:trainprof_cpu_utilization:ratio', \
'node:trainprof_cpu_utilization:ratio', 'node:trainprof_cpu_iowait:ratio', \
'node:trainprof_cpu_core_utilization:max', 'node:trainprof_cpu_core_iowait:max']
    """
    w = format_duration(3 * options.scrape_interval)
    n = lambda metric: on_node(metric, options)  # noqa: E731 - a local shorthand
    total = n("node_memory_MemTotal_bytes")
    # Kernels before 3.14 have no MemAvailable: estimate it as they do, from what is free or
    # reclaimable.
    estimate = " + ".join(
        n(f"node_memory_{field}_bytes")
        for field in ("MemFree", "Buffers", "Cached", "SReclaimable")
    )
    available = f"({n('node_memory_MemAvailable_bytes')} or {estimate})"
    idle = cpu_seconds("idle", options)
    iowait = cpu_seconds("iowait", options)
    received = n(f'rate(node_network_receive_bytes_total{{device!="lo"}}[{w}])')
    sent = n(f'rate(node_network_transmit_bytes_total{{device!="lo"}}[{w}])')
    return [
        {
            "record": "cpu:trainprof_cpu_iowait:ratio",
            "expr": f"clamp({iowait}, 0, 1)",
        },
        {
            "record": "cpu:trainprof_cpu_utilization:ratio",
            "expr": f"clamp(1 - {idle} - cpu:trainprof_cpu_iowait:ratio, 0, 1)",
        },
        {
            "record": NODE_CPU["utilization"],
            "expr": "avg by (node) (cpu:trainprof_cpu_utilization:ratio)",
        },
        {"record": NODE_CPU["iowait"], "expr": "avg by (node) (cpu:trainprof_cpu_iowait:ratio)"},
        {
            "record": BUSIEST_CORE["utilization"],
            "expr": "max by (node) (cpu:trainprof_cpu_utilization:ratio)",
        },
        {
            "record": BUSIEST_CORE["iowait"],
            "expr": "max by (node) (cpu:trainprof_cpu_iowait:ratio)",
        },
        {
            "record": "node:trainprof_memory_used:bytes",
            "expr": f"max by (node) ({total} - {available})",
        },
        {
            "record": "node:trainprof_memory_used:ratio",
            "expr": (f"node:trainprof_memory_used:bytes\n/\nmax by (node) ({total})"),
        },
        {
            "record": "node:trainprof_disk_read_bytes:rate",
            "expr": f"sum by (node) ({n(f'rate(node_disk_read_bytes_total[{w}])')})",
        },
        {
            "record": "node:trainprof_disk_written_bytes:rate",
            "expr": f"sum by (node) ({n(f'rate(node_disk_written_bytes_total[{w}])')})",
        },
        {
            "record": "node:trainprof_network_receive_bytes:rate",
            "expr": f"sum by (node) ({received})",
        },
        {
            "record": "node:trainprof_network_transmit_bytes:rate",
            "expr": f"sum by (node) ({sent})",
        },
        {
            "record": "node:trainprof_io_pressure_waiting:ratio",
            "expr": f"max by (node) ({n(f'irate(node_pressure_io_waiting_seconds_total[{w}])')})",
        },
    ]

"""Recording rules that turn NVIDIA dcgm-exporter's series into trainprof's units and labels.

Units: `DCGM_FI_DEV_GPU_UTIL` is a percent (divided by 100), framebuffer fields are MiB
(times 2^20), `DCGM_FI_PROF_*` activities are already ratios. Labels: every output carries
`node`, `gpu`, `uuid`, `model`, the MIG `mig_instance`/`mig_profile` (empty on whole GPUs) and
the workload's `namespace`/`pod`/`container` (empty on GPUs no pod holds), whichever of
dcgm-exporter's spellings the scrape delivered:

| trainprof | dcgm-exporter, most preferred first |
|---|---|
| node | the configured node label, `hostname`, `Hostname` |
| uuid | `UUID`, `gpu_uuid` |
| model | `modelName` |
| mig_instance, mig_profile | `GPU_I_ID`, `GPU_I_PROFILE` |
| pod | `exported_pod`, `pod_name`, `pod` |
| namespace | `exported_namespace`, `pod_namespace`, `namespace` |
| container | `exported_container`, `container_name`, `container` |

`exported_*` wins because it only exists when the scrape kept the target's own `pod`
(the exporter's pod) and renamed the workload's; `pod_name` wins over `pod` because the old
names never clash with target labels. A GPU without a workload behind such a scrape keeps the
exporter's own pod: it never joins a training job, which is what matters.
"""

from __future__ import annotations

from collections.abc import Callable

from trainprof.contract.names import JOB_LABEL
from trainprof.rules.promql import Matcher, selector
from trainprof.sources.labels import coalesce
from trainprof.sources.options import SourceOptions

DEVICE_LABELS = (
    "node",
    "gpu",
    "uuid",
    "model",
    "mig_instance",
    "mig_profile",
    "namespace",
    "pod",
    "container",
)

MIB = 1048576
# Profiling activities (ratios 0..1) mapped as they are; SM_ACTIVE and SM_OCCUPANCY are off
# in dcgm-exporter's default counters, so their recordings are simply empty there.
ACTIVITIES = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_engine_active",
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_SM_OCCUPANCY": "sm_occupancy",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",
}


# The labels a map adds to dcgm-exporter's own: a join on a device's series ignores them.
WRITTEN = tuple(label for label in DEVICE_LABELS if label != "gpu")
# Every dcgm-exporter device series' own labels plus trainprof's, value 1 (the fold, once).
LABELS_MAP = "gpu:trainprof_dcgm_labels:info"
# The same for the GPUs working for a job, with the job's labels.
JOB_MAP = "gpu_job:trainprof_dcgm_labels:info"
# Each job GPU's framebuffer (used + free + reserved MiB) on the same labels.
FB_TOTAL_MAP = "gpu_job:trainprof_dcgm_fb_total:mebibytes"
# GPUs more than one job claims (time-slicing, MPS): one series cannot be split between jobs.
SHARED = "count by (uuid) (gpu:trainprof_gpu_job:info) > 1"
UTILIZATION = "(DCGM_FI_DEV_GPU_UTIL / 100 or DCGM_FI_PROF_GR_ENGINE_ACTIVE)"
USED, FREE, RESERVED = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"
# NVML's total includes the driver's reservation, which dcgm reports apart.
FB_TOTAL = f"({USED} + {FREE} + ({RESERVED} or {USED} * 0))"
# Each device's framebuffer, recorded with the inventory (every few minutes): the job maps
# read the largest of its last two recordings, so a lookback never falls between them.
MEMORY_TOTAL = "gpu:trainprof_gpu_memory_total:bytes"
MEMORY_TOTAL_RANGE = "10m"
# The per-job gauges the rules read (trainprof.sources.gauges).
UTILIZATION_GAUGE = "gpu_job:trainprof_gpu_utilization:ratio"
MEMORY_GAUGE = "gpu_job:trainprof_gpu_memory_used:ratio"


def fold(metric: str, options: SourceOptions) -> str:
    """`metric` with trainprof's DEVICE_LABELS set from dcgm-exporter's spellings of them
    (about 15 `label_replace` per series, the costly part of the adapter)."""
    expr = metric
    node_sources = tuple(dict.fromkeys((options.node_label, "hostname", "Hostname")))
    expr = coalesce(expr, "node", node_sources)
    expr = coalesce(expr, "uuid", ("UUID", "gpu_uuid"))
    expr = coalesce(expr, "model", ("modelName",))
    expr = coalesce(expr, "mig_instance", ("GPU_I_ID",))
    expr = coalesce(expr, "mig_profile", ("GPU_I_PROFILE",))
    for label, old in (
        ("pod", "pod_name"),
        ("namespace", "pod_namespace"),
        ("container", "container_name"),
    ):
        expr = coalesce(expr, label, (f"exported_{label}", old))
    return expr


def attach(expr: str, op: str, mapping: str, labels: tuple[str, ...]) -> str:
    """`expr`, on dcgm-exporter's own series, given `labels` from `mapping` (a map on the
    same series): a hash join in place of the fold's `label_replace` chain.

    >>> print(attach("DCGM_FI_DEV_FB_USED", "*", LABELS_MAP, ("node",)))
    DCGM_FI_DEV_FB_USED
    * ignoring (node, uuid, model, mig_instance, mig_profile, namespace, pod, container)
    group_left (node) gpu:trainprof_dcgm_labels:info
    """
    ignored = ", ".join(dict.fromkeys(WRITTEN + labels))
    return f"{expr}\n{op} ignoring ({ignored})\ngroup_left ({', '.join(labels)}) {mapping}"


def joined(expr: str, op: str, mapping: str, labels: tuple[str, ...], by: tuple[str, ...]) -> str:
    """`attach`, then one series per `by`.

    `max` only merges series that differ in labels trainprof drops (`instance`, `pci_bus_id`,
    `DCGM_FI_DRIVER_VERSION`, ...): one GPU scraped twice by two Prometheus jobs.
    """
    body = attach(expr, op, mapping, labels).replace("\n", "\n  ")
    return f"max by ({', '.join(by)}) (\n  {body}\n)"


def device(metric: str) -> str:
    """`metric` in DEVICE_LABELS, one series per device, through `LABELS_MAP`."""
    return joined(metric, "*", LABELS_MAP, WRITTEN, DEVICE_LABELS)


def map_recordings(options: SourceOptions) -> list[dict[str, str]]:
    """The map of dcgm-exporter's label spellings and what the job maps read from it, in
    evaluation order (`device_group`, every few scrapes: a device's labels change when a
    pod takes it, not at every scrape).

    The fold runs once, on one field per device; every other recording is a join on the
    map, which costs a fraction of the fold:

    >>> [r["record"] for r in map_recordings(SourceOptions())]
    ['gpu:trainprof_dcgm_labels:info', 'gpu:trainprof_gpu_device:info']
    """
    served = f"{USED} or DCGM_FI_DEV_GPU_UTIL or DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    return [
        {
            "record": LABELS_MAP,
            # A MIG instance or another product may serve no FB_USED: any of the fields the
            # rules read marks a device.
            "expr": f"group without (trainprof_kept_node) (\n  {fold(served, options)}\n)",
        },
        {
            "record": "gpu:trainprof_gpu_device:info",
            "expr": f"group by ({', '.join(DEVICE_LABELS)}) ({LABELS_MAP})",
        },
    ]


def inventory_recordings() -> list[dict[str, str]]:
    """Every device's utilization, memory, profiling activities and power in trainprof's
    labels, for dashboards, queries and the alerts naming a field a device does not serve
    (no rule reads them: `inventory_group`, every few minutes); and each device's
    framebuffer size, which never changes, for the job maps.

    >>> [r["record"] for r in inventory_recordings()][:3]
    ['gpu:trainprof_gpu_memory_total:bytes', 'gpu:trainprof_gpu_utilization:ratio', \
'gpu:trainprof_gpu_memory_used:bytes']
    """
    rules = [
        {"record": MEMORY_TOTAL, "expr": device(f"{FB_TOTAL} * {MIB}")},
        {
            # GPU_UTIL is not served for MIG instances nor by some products' DCGM: fall back
            # per device (`or` matches a device's fields, which carry the same labels) to the
            # graphics engine's activity, the same fraction of busy time.
            "record": "gpu:trainprof_gpu_utilization:ratio",
            "expr": device(UTILIZATION),
        },
        {"record": "gpu:trainprof_gpu_memory_used:bytes", "expr": device(f"{USED} * {MIB}")},
        {
            "record": "gpu:trainprof_gpu_memory_used:ratio",
            "expr": f"gpu:trainprof_gpu_memory_used:bytes / {MEMORY_TOTAL}",
        },
    ]
    rules += [
        {"record": f"gpu:trainprof_gpu_{name}:ratio", "expr": device(metric)}
        for metric, name in ACTIVITIES.items()
    ]
    rules.append(
        {"record": "gpu:trainprof_gpu_power:watts", "expr": device("DCGM_FI_DEV_POWER_USAGE")}
    )
    return rules


def job_recordings(options: SourceOptions) -> list[dict[str, str]]:
    """`gpu:trainprof_gpu_job:info`: which job each GPU works for, value 1.

    From the ranks' `trainprof_gpu_assignment_info` (joined on `uuid`) where they serve it,
    else from the GPU's workload pod and that pod's job label in kube-state-metrics'
    `kube_pod_labels` (`options.pod_job_label`). Then `node:trainprof_node_job:info`: the jobs
    on each node, through their GPUs; and the maps `scrape_recordings` join at every scrape.
    """
    jl = ", ".join(options.job_labels)
    rules = []
    by_pod = ""
    if options.pod_job_label:
        pods = coalesce(
            f'kube_pod_labels{{{options.pod_job_label}!=""}}',
            JOB_LABEL,
            (options.pod_job_label,),
        )
        by_pod = (
            "\nor on (uuid)\n"
            f"group by (uuid, {jl}) (\n"
            "  gpu:trainprof_gpu_device:info\n"
            "  * on (namespace, pod) group_left (training_job)\n"
            f"  group by (namespace, pod, training_job) ({pods})\n)"
        )
    rules.append(
        {
            "record": "gpu:trainprof_gpu_job:info",
            "expr": f"group by (uuid, {jl}) (trainprof_gpu_assignment_info){by_pod}",
        }
    )
    rules.append(
        {
            "record": "node:trainprof_node_job:info",
            "expr": (
                f"group by (node, {jl}) (\n"
                "  gpu:trainprof_gpu_job:info\n"
                "  * on (uuid) group_left (node)\n"
                "  group by (uuid, node) (gpu:trainprof_gpu_device:info)\n)"
            ),
        }
    )
    rules.append(
        {
            # A shared GPU is left out (and named by an alert): joining it to two jobs would
            # be a many-to-many match, which fails the whole rule for every GPU.
            "record": JOB_MAP,
            "expr": f"{LABELS_MAP}\n* on (uuid) group_left ({jl})\n"
            f"(gpu:trainprof_gpu_job:info unless on (uuid) ({SHARED}))",
        }
    )
    rules.append(
        {
            # The device's total, from the inventory, on the map's labels: a join of one
            # series per device, where summing the three FB fields again would take three.
            "record": FB_TOTAL_MAP,
            "expr": f"{JOB_MAP}\n* on (uuid, mig_instance) group_left ()\n"
            f"(max by (uuid, mig_instance) (max_over_time({MEMORY_TOTAL}[{MEMORY_TOTAL_RANGE}]))"
            f" / {MIB})",
        }
    )
    labels = ("node", "uuid", *options.job_labels)
    by = ("node", "gpu", "uuid", *options.job_labels)
    rules.append(
        {
            # For dashboards, the report and OverallSystemUsage: framebuffer use changes
            # slowly; the rules read dcgm-exporter's own samples (`from_samples`).
            "record": MEMORY_GAUGE,
            "expr": joined(USED, "/", FB_TOTAL_MAP, labels, by),
        }
    )
    return rules


def scrape_recordings(options: SourceOptions) -> list[dict[str, str]]:
    """Each job GPU's utilization, at every scrape: dcgm-exporter's own series joined to the
    map `job_recordings` keeps, so no label is rewritten per scrape. The bottleneck rules
    compare it with the host at each scrape, and LowGPUUtilization and BatchSize read it.

    >>> print(scrape_recordings(SourceOptions())[0]["expr"])
    max by (node, gpu, uuid, namespace, training_job) (
      (DCGM_FI_DEV_GPU_UTIL / 100 or DCGM_FI_PROF_GR_ENGINE_ACTIVE)
      * ignoring (node, uuid, model, mig_instance, mig_profile, namespace, pod, container, \
training_job)
      group_left (node, uuid, namespace, training_job) gpu_job:trainprof_dcgm_labels:info
    )
    """
    labels = ("node", "uuid", *options.job_labels)
    by = ("node", "gpu", "uuid", *options.job_labels)
    return [{"record": UTILIZATION_GAUGE, "expr": joined(UTILIZATION, "*", JOB_MAP, labels, by)}]


def from_samples(
    gauge: str,
    over_time: Callable[[str], str],
    job_labels: tuple[str, ...],
    matchers: tuple[Matcher, ...] = (),
) -> str | None:
    """A rule's `over_time` of the per-job `gauge` (`over_time(selector)`: a function of a
    series' samples over a range that scales with them, as `quantile_over_time`,
    `avg_over_time` or the difference of two), taken on dcgm-exporter's own samples and joined
    to the job map once, at the rule's evaluation; None where the rules read the gauge as
    recorded at each scrape.

    Framebuffer use: the rules read every scrape of `DCGM_FI_DEV_FB_USED`, divided by the
    device's size at the end (a constant), where the gauge is recorded once a minute.

    >>> print(from_samples(MEMORY_GAUGE, lambda s: f"avg_over_time({s}[5m])", ("job",)))
    max by (node, gpu, uuid, job) (
      (avg_over_time(DCGM_FI_DEV_FB_USED[5m]))
      / ignoring (node, uuid, model, mig_instance, mig_profile, namespace, pod, container, job)
      group_left (node, uuid, job) gpu_job:trainprof_dcgm_fb_total:mebibytes
    )
    >>> from_samples(UTILIZATION_GAUGE, lambda s: s, ("job",)) is None
    True
    """
    if gauge != MEMORY_GAUGE:
        return None
    labels = ("node", "uuid", *job_labels)
    by = ("node", "gpu", "uuid", *job_labels)
    return joined(f"({over_time(USED)})", "/", selector(FB_TOTAL_MAP, matchers), labels, by)

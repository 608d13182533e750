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


def device(metric: str, options: SourceOptions) -> str:
    """`metric` with dcgm-exporter's labels folded into DEVICE_LABELS, one series per device.

    `max` only merges series that differ in labels trainprof drops (`instance`, `pci_bus_id`,
    `DCGM_FI_DRIVER_VERSION`, ...): one GPU scraped twice by two Prometheus jobs.
    """
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
    return f"max by ({', '.join(DEVICE_LABELS)}) (\n  {expr}\n)"


def recordings(options: SourceOptions) -> list[dict[str, str]]:
    """The dcgm-exporter normalisation the rules read, in evaluation order.

    Relabelling costs about 15 `label_replace` per series (one per label variant), so the
    arithmetic runs on dcgm-exporter's own series first: they carry one device's labels on
    every field, so default matching pairs them. Then one relabelling per recording, three
    in all, where each of the five fields they read was relabelled before:

    >>> [r["record"] for r in recordings(SourceOptions())][:3]
    ['gpu:trainprof_gpu_utilization:ratio', 'gpu:trainprof_gpu_memory_used:bytes', \
'gpu:trainprof_gpu_memory_total:bytes']
    """
    used, free, reserved = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"
    return [
        {
            # GPU_UTIL is not served for MIG instances nor by some products' DCGM: fall back
            # per device (`or` matches a device's fields, which carry the same labels) to the
            # graphics engine's activity, the same fraction of busy time.
            "record": "gpu:trainprof_gpu_utilization:ratio",
            "expr": device(
                "(DCGM_FI_DEV_GPU_UTIL / 100 or DCGM_FI_PROF_GR_ENGINE_ACTIVE)", options
            ),
        },
        {
            "record": "gpu:trainprof_gpu_memory_used:bytes",
            "expr": device(f"{used} * {MIB}", options),
        },
        {
            # NVML's total includes the driver's reservation, which dcgm reports apart.
            "record": "gpu:trainprof_gpu_memory_total:bytes",
            "expr": device(f"({used} + {free} + ({reserved} or {used} * 0)) * {MIB}", options),
        },
        {
            "record": "gpu:trainprof_gpu_memory_used:ratio",
            "expr": "gpu:trainprof_gpu_memory_used:bytes / gpu:trainprof_gpu_memory_total:bytes",
        },
        {
            "record": "gpu:trainprof_gpu_device:info",
            "expr": f"group by ({', '.join(DEVICE_LABELS)}) (\n"
            "  gpu:trainprof_gpu_memory_used:bytes\n  or gpu:trainprof_gpu_utilization:ratio\n)",
        },
    ]


def activity_recordings(options: SourceOptions) -> list[dict[str, str]]:
    """dcgm's profiling activities and power, normalised for dashboards and queries.

    No rule reads them, so they run in their own group at most once a minute instead of at
    every scrape (six relabellings of every GPU's series).
    """
    rules = [
        {"record": f"gpu:trainprof_gpu_{name}:ratio", "expr": device(metric, options)}
        for metric, name in ACTIVITIES.items()
    ]
    rules.append(
        {
            "record": "gpu:trainprof_gpu_power:watts",
            "expr": device("DCGM_FI_DEV_POWER_USAGE", options),
        }
    )
    return rules


def job_recordings(options: SourceOptions) -> list[dict[str, str]]:
    """`gpu:trainprof_gpu_job:info`: which job each GPU works for, value 1.

    From the ranks' `trainprof_gpu_assignment_info` (joined on `uuid`) where they serve it,
    else from the GPU's workload pod and that pod's job label in kube-state-metrics'
    `kube_pod_labels` (`options.pod_job_label`). Then `node:trainprof_node_job:info`: the jobs
    on each node, through their GPUs.
    """
    jl = ", ".join(options.job_labels)
    rules = []
    by_pod = ""
    if options.pod_job_label:
        pods = coalesce(
            f'kube_pod_labels{{{options.pod_job_label}!=""}}',
            "training_job",
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
    return rules

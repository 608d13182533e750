"""The rule groups of the source adapters, in evaluation order: the device and inventory
groups (dcgm) and the per-scrape `trainprof.sources` group, each with the
`TrainprofRuleInputMissing` alerts naming an absent series (see the package's docstring)."""

from __future__ import annotations

from typing import Any

from trainprof.contract import metrics as contract
from trainprof.contract.durations import format_duration
from trainprof.contract.names import HEALTH_RULE, INPUT_MISSING_ALERT, VERSION_LABEL
from trainprof.sources import dcgm, gauges, node_exporter
from trainprof.sources.options import SourceOptions

GROUP = "trainprof.sources"
DEVICE_GROUP = "trainprof.sources.devices"
# The device group runs every this many scrapes, at most a minute apart (never faster than
# the scrapes): a quarter of the fold's per-scrape cost, and a pod that takes a GPU joins its
# job's series within a minute.
DEVICE_SCRAPES = 4
DEVICE_INTERVAL = 60.0
INVENTORY_GROUP = "trainprof.sources.inventory"
# Every device's recordings, which no rule reads: every 20 scrapes, at most 5 minutes apart.
INVENTORY_SCRAPES = 20
INVENTORY_INTERVAL = 300.0


def adapter_groups(sources: tuple[str, ...], options: SourceOptions) -> list[dict[str, Any]]:
    """The groups that map `sources` into trainprof's series, in evaluation order: the
    device and inventory groups (dcgm) first, whose maps and totals the others read."""
    groups = [
        device_group(sources, options),
        inventory_group(sources, options),
        normalisation_group(sources, options),
    ]
    return [g for g in groups if g is not None]


def _every(options: SourceOptions, scrapes: int, longest: float) -> str:
    return format_duration(
        max(options.scrape_interval, min(longest, scrapes * options.scrape_interval))
    )


def device_group(sources: tuple[str, ...], options: SourceOptions) -> dict[str, Any] | None:
    """`trainprof.sources.devices` when dcgm is a source: which device each dcgm-exporter
    series is and which job it works for (the maps the per-scrape gauges join), and the
    alerts naming dcgm series that are absent or a GPU jobs share."""
    if "dcgm" not in sources:
        return None
    rules: list[dict[str, Any]] = dcgm.map_recordings(options) + dcgm.job_recordings(options)
    rules.append(gauges.gpu_recordings(options, "memory_used"))
    rules += _missing_dcgm(options)
    return {
        "name": DEVICE_GROUP,
        "interval": _every(options, DEVICE_SCRAPES, DEVICE_INTERVAL),
        "rules": rules,
    }


def inventory_group(sources: tuple[str, ...], options: SourceOptions) -> dict[str, Any] | None:
    """`trainprof.sources.inventory` when dcgm is a source: every device's utilization,
    memory, activities and power in trainprof's labels, for dashboards and queries, and the
    alerts naming a field a device does not serve."""
    if "dcgm" not in sources:
        return None
    return {
        "name": INVENTORY_GROUP,
        "interval": _every(options, INVENTORY_SCRAPES, INVENTORY_INTERVAL),
        "rules": dcgm.inventory_recordings() + _missing_dcgm_fields(options),
    }


def normalisation_group(sources: tuple[str, ...], options: SourceOptions) -> dict[str, Any] | None:
    """The `trainprof.sources` group for `sources`, evaluated at every scrape, or None when
    there is nothing to map."""
    rules: list[dict[str, Any]] = []
    if "dcgm" in sources:
        rules += dcgm.scrape_recordings(options)
        rules.append(gauges.gpu_recordings(options, "utilization"))
    elif "node_exporter" in sources:
        jl = ", ".join(options.job_labels)
        rules.append(
            {
                "record": "node:trainprof_node_job:info",
                "expr": f"group by (node, {jl}) (trainprof_gpu_assignment_info)",
            }
        )
    if "node_exporter" in sources:
        rules += node_exporter.recordings(options) + gauges.host_recordings(options)
    if not rules:
        return None
    rules.append(gauges.node_scrapes(sources, options))
    rules += _missing_host(sources, options)
    return {"name": GROUP, "interval": format_duration(options.scrape_interval), "rules": rules}


def default_rules_text(generator: str) -> str:
    """`rules/trainprof.sources.rules.yaml`: the groups for dcgm-exporter and node_exporter
    with the default options (a `node` label on node_exporter's targets, PyTorchJob pods)."""
    from trainprof.generation.render import to_yaml

    both, options = ("dcgm", "node_exporter"), SourceOptions()
    return to_yaml({"groups": adapter_groups(both, options)}, generator)


def _missing_dcgm(options: SourceOptions) -> list[dict[str, Any]]:
    """`TrainprofRuleInputMissing` for dcgm: the `input` label names the series."""
    jl = ", ".join(options.job_labels)
    return [
        *_missing(
            "DCGM_FI_DEV_FB_USED",
            "absent(DCGM_FI_DEV_FB_USED)",
            "No dcgm-exporter series reach this Prometheus: DCGM_FI_DEV_FB_USED is absent, "
            "so no GPU rule can fire. Check dcgm-exporter's ServiceMonitor or scrape job.",
            scope="cluster",
        ),
        *_missing(
            "DCGM_FI_DEV_FB_USED",
            f"group by (uuid, {jl}) (trainprof_gpu_assignment_info)\n"
            "unless on (uuid)\ngpu:trainprof_gpu_device:info",
            "have no dcgm-exporter series (DCGM_FI_DEV_FB_USED with their UUID is absent): "
            "is dcgm-exporter running on their nodes?",
            scope="gpu",
            options=options,
        ),
        *_missing(
            "DCGM_FI_DEV_GPU_UTIL",
            f"gpu:trainprof_gpu_job:info\nand on (uuid)\n({dcgm.SHARED})",
            "work for this job and at least one other: dcgm-exporter's series of a shared "
            "GPU cannot be told apart by job, so they are left out of every job's GPU rules "
            "while they are shared",
            scope="shared_gpu",
            summary="GPUs work for more than one job: their dcgm-exporter series are left out.",
            options=options,
        ),
    ]


def _missing_dcgm_fields(options: SourceOptions) -> list[dict[str, Any]]:
    """`TrainprofRuleInputMissing` for a field a dcgm device does not serve."""
    return [
        *_missing(
            "DCGM_FI_DEV_GPU_UTIL",
            "gpu:trainprof_gpu_device:info\nunless on (uuid, mig_instance)\n"
            "gpu:trainprof_gpu_utilization:ratio",
            "serve neither DCGM_FI_DEV_GPU_UTIL nor DCGM_FI_PROF_GR_ENGINE_ACTIVE, so their "
            "utilization rules cannot fire. Add one of them to dcgm-exporter's counters CSV",
            scope="gpu",
            options=options,
        ),
        *_missing(
            "DCGM_FI_DEV_FB_FREE",
            "gpu:trainprof_gpu_device:info\nunless on (uuid, mig_instance)\n"
            "gpu:trainprof_gpu_memory_used:ratio",
            "do not serve both DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_FB_FREE, so their memory "
            "rules cannot fire",
            scope="gpu",
            options=options,
        ),
    ]


def _missing_host(sources: tuple[str, ...], options: SourceOptions) -> list[dict[str, Any]]:
    """`TrainprofRuleInputMissing` for node_exporter (and the ranks' GPU assignment it joins
    nodes to jobs through without dcgm)."""
    alerts = []
    if "node_exporter" in sources and "dcgm" not in sources:
        # Without dcgm the nodes join their jobs only through the ranks' GPU assignment.
        alerts.extend(
            _missing(
                contract.GPU_ASSIGNMENT_INFO,
                "absent(trainprof_gpu_assignment_info)",
                "No rank serves trainprof_gpu_assignment_info, so no node joins a training "
                "job and no host rule can fire on node_exporter's series. Run the training "
                "API on the ranks (trainprof.start), or add dcgm to the source.",
                scope="cluster",
            )
        )
    if "node_exporter" in sources:
        alerts += [
            *_missing(
                "node_cpu_seconds_total",
                # absent() reads every series it selects: one per node is enough (every
                # host has a core 0 with an `idle` mode; a regex matcher adds no label to
                # the alert, where `cpu="0"` would).
                'absent(node_cpu_seconds_total{cpu=~"0", mode=~"idle"})',
                "No node_exporter series reach this Prometheus: node_cpu_seconds_total is "
                "absent, so no host rule can fire.",
                scope="cluster",
            ),
            *_missing(
                "node_cpu_seconds_total",
                # The node-level recording: a node has it when any of its cores has a ratio.
                "node:trainprof_node_job:info\nunless on (node)\n"
                "node:trainprof_cpu_utilization:ratio",
                "run it but no node_cpu_seconds_total carries their "
                f"{options.node_label} label: is node_exporter running there, and does its "
                "scrape set that label?",
                scope="node",
                options=options,
            ),
            *_missing(
                "node_memory_MemAvailable_bytes",
                "node:trainprof_node_job:info\nunless on (node)\nnode:trainprof_memory_used:ratio",
                "run it but do not serve node_memory_MemAvailable_bytes and "
                "node_memory_MemTotal_bytes",
                scope="node",
                options=options,
            ),
        ]
    return alerts


# What a missing input of each scope below the cluster concerns: one alert per job counts
# them (trainprof.rules.job_alerts), its recording lists them.
_UNITS = {
    "gpu": ("GPU", "GPUs", "{{ .Labels.uuid }}{{ with .Labels.node }} on {{ . }}{{ end }}"),
    "shared_gpu": ("GPU", "GPUs", "{{ .Labels.uuid }}"),
    "node": ("node", "nodes", "{{ .Labels.node }}"),
}


def _missing(
    series: str,
    expr: str,
    description: str,
    scope: str,
    summary: str = "",
    options: SourceOptions | None = None,
) -> list[dict[str, Any]]:
    """The alert naming an absent input: for the whole cluster, as written; for GPUs or
    nodes (`description` then says what they do, in the plural), their recording and one
    alert per job counting them."""
    labels = {
        "rule": HEALTH_RULE,
        "severity": "warning",
        "affects": "sources",
        "input": series,
        "scope": scope,
        VERSION_LABEL: "1",
    }
    annotations = {
        "summary": summary or f"A series the rules read is absent: {series}.",
        "description": description,
    }
    alert: dict[str, Any] = {
        "alert": INPUT_MISSING_ALERT,
        "expr": expr,
        "for": "5m",
        "labels": labels,
        "annotations": annotations,
    }
    if scope not in _UNITS:
        return [alert]
    from trainprof.rules.job_alerts import Affected, health_metric
    from trainprof.rules.model import Units

    assert options is not None, "a per-unit input names its job labels"
    singular, plural, name = _UNITS[scope]
    own = {k: labels[k] for k in ("affects", "input", "scope")}
    found = Affected(
        HEALTH_RULE,
        INPUT_MISSING_ALERT,
        "warning",
        own,
        Units(scope, singular, plural, name, None, value=""),
        0,  # an input comes back or stays missing: nothing to hold through
        metric=health_metric(INPUT_MISSING_ALERT),
    )
    alert["expr"] = found.alert_expr(options.job_labels)
    annotations["description"] = found.description(description, options.job_labels, ())
    return [found.recording(expr), alert]

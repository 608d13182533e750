"""Where a series' job identity comes from in Kubernetes: the scrape's relabelling.

One list per monitor, written in prometheus-operator's form (the chart's ServiceMonitor and
PodMonitor include them from `helm/trainprof/files/relabelings/`), and translated one to one
into Prometheus' own `relabel_configs` for a plain Prometheus with `kubernetes_sd_configs`
(`docs/scrape/kubernetes.yml`). Both come from this module, so they cannot disagree.

Identity of a training rank, each label from exactly one place:

    training_job  the first pod label present, in this order:
                  1. training.kubeflow.org/job-name   Kubeflow training-operator (PyTorchJob ...)
                  2. jobset.sigs.k8s.io/jobset-name   JobSet (Kubeflow Trainer v2)
                  3. volcano.sh/job-name              Volcano
                  4. batch.kubernetes.io/job-name, then job-name    a plain Job
    namespace     the pod's namespace
    node          the pod's node (spec.nodeName)
    pod           the pod's name
    rank          the process's own `rank` (torchrun's RANK, exact for every process of a
                  multi-process pod); only when the process has none (no RANK in a pod), the
                  pod's index: Kubeflow <replica-type>-<replica-index>, JobSet or an Indexed
                  Job's job-completion-index, Volcano's task-index (label, else annotation).
                  The index travels as the target label `trainprof_pod_index`, which the
                  metric relabelling folds into `rank` and drops, so a stored series has one
                  `rank` and Prometheus never renames one to `exported_rank`.

The process emits no `training_job` or `node` inside Kubernetes (trainprof.training.identity), so
the target labels above are the only ones.

    >>> to_prometheus([{"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "pod",
    ...                 "action": "Replace"}])
    [{'source_labels': ['__meta_kubernetes_pod_name'], 'target_label': 'pod', 'action': 'replace'}]
"""

from __future__ import annotations

from typing import Any

from trainprof.contract.names import JOB_LABEL

POD_INDEX = "trainprof_pod_index"
# A rank serves on a container port named trainprof (local rank 0) or trainprof-<LOCAL_RANK>.
PORT_NAME_PATTERN = "trainprof(-[0-9]+)?"


def pod_label(name: str) -> str:
    """Kubernetes SD's meta label for a pod label: every character not valid in a label name
    becomes `_`.

    >>> pod_label("training.kubeflow.org/job-name")
    '__meta_kubernetes_pod_label_training_kubeflow_org_job_name'
    """
    return "__meta_kubernetes_pod_label_" + _sanitize(name)


def pod_annotation(name: str) -> str:
    return "__meta_kubernetes_pod_annotation_" + _sanitize(name)


def _sanitize(name: str) -> str:
    return "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name)


# Highest precedence first; the relabelling applies them lowest first so the highest present
# one is written last.
JOB_NAME_SOURCES = (
    ("Kubeflow training-operator", pod_label("training.kubeflow.org/job-name")),
    ("JobSet", pod_label("jobset.sigs.k8s.io/jobset-name")),
    ("Volcano", pod_label("volcano.sh/job-name")),
    ("Job", pod_label("batch.kubernetes.io/job-name")),
    ("Job (before Kubernetes 1.27)", pod_label("job-name")),
)
POD_INDEX_SOURCES = (
    (
        "Kubeflow training-operator",
        [
            pod_label("training.kubeflow.org/replica-type"),
            pod_label("training.kubeflow.org/replica-index"),
        ],
    ),
    ("JobSet / Indexed Job", [pod_label("batch.kubernetes.io/job-completion-index")]),
    ("Volcano (label)", [pod_label("volcano.sh/task-index")]),
    ("Volcano (annotation)", [pod_annotation("volcano.sh/task-index")]),
)


def _first_present(sources, target: str) -> list[dict[str, Any]]:
    steps = []
    for _, labels in reversed(sources):
        labels = labels if isinstance(labels, list) else [labels]
        step: dict[str, Any] = {"sourceLabels": labels}
        if len(labels) > 1:
            # Both parts present: "worker;3" -> "worker-3"; one missing leaves the label alone.
            step.update(regex="(.+);(.+)", replacement="$1-$2")
        else:
            step.update(regex="(.+)", replacement="$1")
        step.update(targetLabel=target, action="replace")
        steps.append(step)
    return steps


def port_keep(port_name_pattern: str = PORT_NAME_PATTERN) -> dict[str, Any]:
    """Keep only the container ports named by the convention (one target per rank)."""
    return {
        "sourceLabels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": port_name_pattern,
        "action": "keep",
    }


def rank_relabelings(port_name_pattern: str = PORT_NAME_PATTERN) -> list[dict[str, Any]]:
    """The PodMonitor's relabelings: keep the ranks' ports, then the identity labels."""
    return [port_keep(port_name_pattern), *rank_identity_relabelings()]


def rank_identity_relabelings() -> list[dict[str, Any]]:
    """training_job, namespace, node, pod and the pod index, each from one source."""
    return [
        *_first_present(JOB_NAME_SOURCES, JOB_LABEL),
        {"sourceLabels": ["__meta_kubernetes_namespace"], "targetLabel": "namespace"},
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"},
        {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "pod"},
        *_first_present(POD_INDEX_SOURCES, POD_INDEX),
    ]


def rank_metric_relabelings() -> list[dict[str, Any]]:
    """After the scrape: a series without its own `rank` takes the pod's index."""
    return [
        {
            "sourceLabels": ["rank", POD_INDEX],
            "regex": ";(.+)",
            "replacement": "$1",
            "targetLabel": "rank",
            "action": "replace",
        },
        {"regex": POD_INDEX, "action": "labeldrop"},
    ]


def exporter_relabelings() -> list[dict[str, Any]]:
    """The exporter's ServiceMonitor: `node` from the pod's node (the exporter emits none in
    Kubernetes); the job comes from the GPU assignment join, never from the exporter pod."""
    return [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"},
    ]


_KEYS = {
    "sourceLabels": "source_labels",
    "separator": "separator",
    "targetLabel": "target_label",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}


def to_prometheus(relabelings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """prometheus-operator RelabelConfigs -> Prometheus relabel_configs, one to one (the same
    steps in the same order; only the key spelling changes, and the operator's lowercase
    action names are Prometheus' own)."""
    out = []
    for step in relabelings:
        unknown = set(step) - set(_KEYS)
        if unknown:
            raise ValueError(f"unknown relabeling key(s) {sorted(unknown)} in {step}")
        converted = {_KEYS[k]: v for k, v in step.items()}
        if "action" in converted:
            converted["action"] = str(converted["action"]).lower()
        out.append(converted)
    return out


def kubernetes_scrape_configs(
    exporter_port_name: str = "metrics", port_name_pattern: str = PORT_NAME_PATTERN
) -> dict[str, Any]:
    """The chart's two monitors for a Prometheus without the operator: kubernetes_sd_configs
    with the same relabelling (docs/scrape/kubernetes.yml)."""
    return {
        "scrape_configs": [
            {
                "job_name": "trainprof-exporter",
                "kubernetes_sd_configs": [{"role": "pod"}],
                "relabel_configs": [
                    {
                        "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
                        "regex": "trainprof",
                        "action": "keep",
                    },
                    {
                        "source_labels": [
                            "__meta_kubernetes_pod_label_app_kubernetes_io_component"
                        ],
                        "regex": "exporter",
                        "action": "keep",
                    },
                    {
                        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                        "regex": exporter_port_name,
                        "action": "keep",
                    },
                    *to_prometheus(exporter_relabelings()),
                ],
            },
            {
                "job_name": "trainprof-ranks",
                "kubernetes_sd_configs": [{"role": "pod"}],
                "relabel_configs": [
                    {
                        "source_labels": ["__meta_kubernetes_pod_label_trainprof_io_scrape"],
                        "regex": "true",
                        "action": "keep",
                    },
                    *to_prometheus(rank_relabelings(port_name_pattern)),
                ],
                "metric_relabel_configs": to_prometheus(rank_metric_relabelings()),
            },
        ]
    }


def _pasted(generator: str, comment: str, scrape_configs: dict[str, Any]) -> str:
    """A generated file of scrape jobs to paste: the header, `comment`, the jobs in YAML."""
    from trainprof.generation.render import header, to_yaml

    return header(generator) + comment + to_yaml(scrape_configs)


def kubernetes_scrape_text(generator: str) -> str:
    return _pasted(
        generator,
        "# The chart's ServiceMonitor and PodMonitor for a Prometheus without the operator:\n"
        "# paste these jobs under scrape_configs (docs/kubernetes.md explains the labels).\n",
        kubernetes_scrape_configs(),
    )


FILE_SD_GLOB = "/shared/prometheus/trainprof/*.json"


def file_sd_scrape_configs(pattern: str = FILE_SD_GLOB) -> dict[str, Any]:
    """SLURM / bare metal: the ranks announce themselves (trainprof.deploy.file_sd); the node
    exporters are listed by hand or by your inventory."""
    return {
        "scrape_configs": [
            {
                "job_name": "trainprof-ranks",
                # The file's labels are the rank's own identity, equal to what it exposes:
                # honouring the scraped ones keeps one copy and puts the job on `up` too.
                "honor_labels": True,
                "file_sd_configs": [{"files": [pattern], "refresh_interval": "30s"}],
            },
            {
                "job_name": "trainprof-exporter",
                "static_configs": [{"targets": ["gpu-node-01:9945", "gpu-node-02:9945"]}],
            },
        ]
    }


def file_sd_scrape_text(generator: str) -> str:
    return _pasted(
        generator,
        "# SLURM / bare metal: every rank started with TRAINPROF_FILE_SD_DIR writes its\n"
        '# target into that directory (docs/kubernetes.md, "Outside Kubernetes").\n',
        file_sd_scrape_configs(),
    )

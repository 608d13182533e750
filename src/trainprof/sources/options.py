"""What a source adapter needs to know about a cluster's scrape configuration."""

from __future__ import annotations

import dataclasses

from trainprof.contract.names import JOB_LABELS
from trainprof.rules.promql import LABEL_NAME

SOURCES = ("trainprof", "dcgm", "node_exporter")


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    """How the exporters' series are labelled where the rules run.

    node_label: the label holding the node's name on node_exporter's (and, when set by
        relabelling, dcgm-exporter's) series; `instance` is accepted and loses its `:port`.
    job_labels: the labels naming a training job, as on trainprof's own series.
    pod_job_label: the `kube_pod_labels` label (kube-state-metrics) naming a pod's training
        job, e.g. `label_training_kubeflow_org_job_name`; empty to join GPUs to jobs only
        through the ranks' `trainprof_gpu_assignment_info`.
    scrape_interval: seconds between scrapes; counters are turned into per-scrape rates over
        three of them, so one missed scrape does not leave a hole.
    """

    node_label: str = "node"
    job_labels: tuple[str, ...] = JOB_LABELS
    pod_job_label: str = "label_training_kubeflow_org_job_name"
    scrape_interval: float = 15.0

    def __post_init__(self) -> None:
        for name in (self.node_label, *self.job_labels, *filter(None, [self.pod_job_label])):
            if not LABEL_NAME.match(name):
                raise ValueError(f"not a Prometheus label name: {name!r}")
        if not self.scrape_interval > 0:
            raise ValueError(f"scrape_interval must be positive, got {self.scrape_interval!r}")


def parse_sources(text: str) -> tuple[str, ...]:
    """`trainprof`, `dcgm`, `node_exporter`, or a comma-separated combination of them.

    >>> parse_sources("dcgm, node_exporter")
    ('dcgm', 'node_exporter')
    >>> parse_sources("dcgm,nvml")
    Traceback (most recent call last):
    ...
    ValueError: unknown source 'nvml' (known: trainprof, dcgm, node_exporter)
    """
    names = [part.strip() for part in str(text).split(",") if part.strip()]
    if not names:
        raise ValueError("no source named (known: " + ", ".join(SOURCES) + ")")
    for name in names:
        if name not in SOURCES:
            raise ValueError(f"unknown source {name!r} (known: {', '.join(SOURCES)})")
    if set(SOURCES) <= set(names):
        raise ValueError(
            "trainprof with both dcgm and node_exporter: dcgm serves the GPU signals and "
            "node_exporter the host's, so trainprof's exporter would serve none"
        )
    return tuple(dict.fromkeys(names))


def signal_sources(names: tuple[str, ...]) -> tuple[str, str]:
    """Which source serves the GPU signals and which the host's, of a `source` setting.

    >>> signal_sources(("dcgm",))
    ('dcgm', 'trainprof')
    >>> signal_sources(("trainprof", "node_exporter"))
    ('trainprof', 'node_exporter')
    """
    gpu = "dcgm" if "dcgm" in names else "trainprof"
    host = "node_exporter" if "node_exporter" in names else "trainprof"
    return gpu, host

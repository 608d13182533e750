"""Which identity labels the exporter puts on its series: `node` and `training_job`.

Each comes from exactly one place per deployment, or Prometheus renames one copy to
`exported_*` (DESIGN.md):

    flag (--identity.node, --identity.training-job)   wins when given, even "" (= not emitted)
    env  (TRAINPROF_NODE, TRAINPROF_JOB)               next
    default                                            node = the hostname outside Kubernetes;
                                                       nothing inside it (KUBERNETES_SERVICE_HOST
                                                       set), where scrape relabelling attaches
                                                       node and training_job
    >>> resolve(node=None, training_job="bert", env={"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    {'training_job': 'bert'}

The exporter never emits `job`, `instance`, `namespace` or `pod`: those are the target's.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def in_kubernetes(env: Mapping[str, str]) -> bool:
    return bool(env.get("KUBERNETES_SERVICE_HOST"))


def resolve(
    node: str | None = None,
    training_job: str | None = None,
    env: Mapping[str, str] | None = None,
    hostname: str | None = None,
) -> dict[str, str]:
    """The identity labels, in the order the contract lists them (training_job, node)."""
    env = os.environ if env is None else env
    if training_job is None:
        training_job = env.get("TRAINPROF_JOB")
    if node is None:
        node = env.get("TRAINPROF_NODE")
    if node is None and not in_kubernetes(env):
        node = hostname if hostname is not None else socket.gethostname()
    labels = {}
    if training_job:
        labels["training_job"] = training_job
    if node:
        labels["node"] = node
    return labels


def describe(labels: Mapping[str, str], env: Mapping[str, str] | None = None) -> str:
    """One log line saying which identity labels are emitted and why."""
    env = os.environ if env is None else env
    shown = ", ".join(f"{k}={v!r}" for k, v in labels.items()) or "none"
    where = (
        "inside Kubernetes: relabelling attaches the others"
        if in_kubernetes(env)
        else "outside Kubernetes"
    )
    return f"identity labels: {shown} ({where})"

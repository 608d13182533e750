"""Who this training process is: job, node, rank and local rank, from arguments or the environment.

Each field takes the first source that has a value (explicit argument first):

    training_job      argument; TRAINPROF_JOB; inside Kubernetes: none (see below);
                      SLURM_JOB_NAME-SLURM_JOB_ID; TORCHELASTIC_RUN_ID (torchrun --rdzv-id)
    node              argument; TRAINPROF_NODE; inside Kubernetes: none; SLURMD_NODENAME;
                      the host name
    rank              argument; RANK (torchrun); SLURM_PROCID; OMPI_COMM_WORLD_RANK;
                      PMI_RANK; 0
    local_rank        argument; LOCAL_RANK (torchrun); SLURM_LOCALID;
                      OMPI_COMM_WORLD_LOCAL_RANK; MPI_LOCALRANKID; 0
    world_size        argument; WORLD_SIZE; SLURM_NTASKS; OMPI_COMM_WORLD_SIZE; PMI_SIZE; 1
    local_world_size  LOCAL_WORLD_SIZE; SLURM_NTASKS_PER_NODE; OMPI_COMM_WORLD_LOCAL_SIZE; 1
    node_rank         GROUP_RANK (torchrun); PET_NODE_RANK (Kubeflow); SLURM_NODEID; unknown
    restart_count     TORCHELASTIC_RESTART_COUNT; SLURM_RESTART_COUNT; 0

A value that is not a whole number is skipped (and logged by `trainprof.start()`).

Inside Kubernetes (`KUBERNETES_SERVICE_HOST` is set) the scrape configuration owns
`training_job` and `node`: the PodMonitor relabels them from the pod's labels and node name.
Emitting them from the process too would make Prometheus rename one copy to `exported_*`, so
there they come only from an argument or `TRAINPROF_JOB` / `TRAINPROF_NODE`. `rank` stays the
process's own (torchrun's RANK is exact for each process of a pod); a pod with no rank
variable emits none and the chart's PodMonitor fills in the pod's index (trainprof.deploy.relabel).
Set job and node through the downward API when you would rather not relabel (and then do
not relabel):

    env:
      - name: TRAINPROF_NODE
        valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
      - name: TRAINPROF_JOB
        valueFrom: {fieldRef: {fieldPath: "metadata.labels['training.kubeflow.org/job-name']"}}

    >>> ident = resolve(env={"RANK": "3", "LOCAL_RANK": "1", "TRAINPROF_JOB": "bert"},
    ...                 hostname="n1")
    >>> ident.labels()
    {'training_job': 'bert', 'node': 'n1', 'rank': '3', 'local_rank': '1'}

The system exporter follows the same policy for the two labels it carries (`exporter_labels`),
so under SLURM, torchrun or Kubernetes its `node` and `training_job` are the ranks' own:

    >>> exporter_labels(env={"SLURMD_NODENAME": "gpu-n3", "SLURM_JOB_NAME": "bert",
    ...                      "SLURM_JOB_ID": "812"}, hostname="gpu-n3.cluster.local")
    {'training_job': 'bert-812', 'node': 'gpu-n3'}
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
from collections.abc import Mapping

from trainprof.contract.names import JOB_LABEL
from trainprof.training.state import bounded_label_value

_INT_SOURCES = {
    "rank": ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"),
    "local_rank": ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"),
    "world_size": ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE"),
    "local_world_size": ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "node_rank": ("GROUP_RANK", "PET_NODE_RANK", "SLURM_NODEID"),
    "restart_count": ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"),
}
_INT_DEFAULTS: dict[str, int | None] = {
    "rank": 0,
    "local_rank": 0,
    "world_size": 1,
    "local_world_size": 1,
    "node_rank": None,
    "restart_count": 0,
}
_WHOLE_NUMBER = re.compile(r"^\s*(\d+)\s*$")
# SLURM_NTASKS_PER_NODE may read "4(x2)" (4 tasks on each of 2 nodes) or "2(x3),1".
_SLURM_TASKS = re.compile(r"^\s*(\d+)(\(x\d+\))?(,.*)?$")


@dataclasses.dataclass(frozen=True)
class Identity:
    training_job: str | None
    node: str | None
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int | None
    restart_count: int
    in_kubernetes: bool
    sources: Mapping[str, str]  # field -> where its value came from
    problems: tuple[str, ...] = ()  # unusable environment values that were skipped

    def labels(self) -> dict[str, str]:
        """The identity labels this process emits, in `metrics.TRAINING_IDENTITY` order."""
        labels = {}
        if self.training_job:
            labels[JOB_LABEL] = bounded_label_value(self.training_job)
        if self.node:
            labels["node"] = bounded_label_value(self.node)
        if not (self.in_kubernetes and self.sources.get("rank") == "default"):
            # In a pod without RANK the scrape supplies the pod's index instead (relabel.py).
            labels["rank"] = str(self.rank)
        labels["local_rank"] = str(self.local_rank)
        return labels

    def info(self) -> dict[str, str]:
        """Labels for `trainprof_training_info` besides the framework."""
        return {
            "world_size": str(self.world_size),
            "node_rank": "" if self.node_rank is None else str(self.node_rank),
            "restart_count": str(self.restart_count),
        }


def resolve(
    *,
    training_job: str | None = None,
    node: str | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    env: Mapping[str, str],
    hostname: str | None = None,
) -> Identity:
    """The identity from explicit arguments, then `env`, then defaults (see the module doc)."""
    sources: dict[str, str] = {}
    problems: list[str] = []
    in_kubernetes = bool(env.get("KUBERNETES_SERVICE_HOST"))

    def text(field, argument, variable, fallbacks):
        if argument not in (None, ""):
            sources[field] = "argument"
            return str(argument)
        if env.get(variable):
            sources[field] = variable
            return env[variable]
        if in_kubernetes:
            sources[field] = "scrape relabelling (Kubernetes)"
            return None
        for name, value in fallbacks:
            if value:
                sources[field] = name
                return value
        sources[field] = "unset"
        return None

    slurm_job = env.get("SLURM_JOB_NAME")
    if slurm_job and env.get("SLURM_JOB_ID"):
        slurm_job = f"{slurm_job}-{env['SLURM_JOB_ID']}"
    run_id = env.get("TORCHELASTIC_RUN_ID")
    job = text(
        "training_job",
        training_job,
        "TRAINPROF_JOB",
        [
            ("SLURM_JOB_NAME", slurm_job),
            ("TORCHELASTIC_RUN_ID", run_id if run_id != "none" else None),
        ],
    )
    host = text(
        "node",
        node,
        "TRAINPROF_NODE",
        [
            ("SLURMD_NODENAME", env.get("SLURMD_NODENAME")),
            ("host name", hostname if hostname is not None else socket.gethostname()),
        ],
    )

    arguments = {"rank": rank, "local_rank": local_rank, "world_size": world_size}
    numbers: dict[str, int | None] = {}
    for field, variables in _INT_SOURCES.items():
        numbers[field] = _INT_DEFAULTS[field]
        sources[field] = "default"
        candidates: list[tuple[str, object]] = [(f"{field} argument", arguments.get(field))]
        candidates += [(variable, env.get(variable)) for variable in variables]
        for source, raw in candidates:
            if raw is None or raw == "":
                continue
            pattern = _SLURM_TASKS if source == "SLURM_NTASKS_PER_NODE" else _WHOLE_NUMBER
            match = pattern.match(str(raw)) if not isinstance(raw, bool) else None
            if not match:
                problems.append(f"{source}={raw!r} is not a whole number; ignored")
                continue
            numbers[field] = int(match.group(1))
            sources[field] = "argument" if source.endswith(" argument") else source
            break

    def count(field: str) -> int:
        value = numbers[field]
        if value is None:  # only node_rank has no default
            raise AssertionError(f"{field} has no default")
        return value

    return Identity(
        training_job=job,
        node=host,
        rank=count("rank"),
        local_rank=count("local_rank"),
        world_size=count("world_size"),
        local_world_size=max(count("local_world_size"), 1),
        node_rank=numbers["node_rank"],
        restart_count=count("restart_count"),
        in_kubernetes=in_kubernetes,
        sources=sources,
        problems=tuple(problems),
    )


def exporter_labels(
    node: str | None = None,
    training_job: str | None = None,
    env: Mapping[str, str] | None = None,
    hostname: str | None = None,
) -> dict[str, str]:
    """The system exporter's identity labels (training_job, node), by `resolve`'s policy.

    A flag given as "" means the label is not emitted at all (a deployment where scrape
    relabelling attaches it).
    """
    ident = resolve(
        training_job=training_job or None,
        node=node or None,
        env=os.environ if env is None else env,
        hostname=hostname,
    )
    labels = {}
    if training_job != "" and ident.training_job:
        labels[JOB_LABEL] = bounded_label_value(ident.training_job)
    if node != "" and ident.node:
        labels["node"] = bounded_label_value(ident.node)
    return labels


def describe(labels: Mapping[str, str], env: Mapping[str, str] | None = None) -> str:
    """One log line saying which identity labels are emitted and why."""
    env = os.environ if env is None else env
    shown = ", ".join(f"{k}={v!r}" for k, v in labels.items()) or "none"
    where = (
        "inside Kubernetes: relabelling attaches the others"
        if env.get("KUBERNETES_SERVICE_HOST")
        else "outside Kubernetes"
    )
    return f"identity labels: {shown} ({where})"

"""GPU-to-job attribution for a node-wide exporter (`gpu_attribution: assignment`).

A DaemonSet exporter knows GPUs, not jobs. Each training rank exports
`trainprof_gpu_assignment_info{uuid, <job labels>}` for the GPU it uses, so a per-GPU alert
is joined to the job that holds its GPU:

    (
      <the alert's expression, one series per uuid>
    )
    * on (uuid) group_left (namespace, training_job)
    (
      max by (uuid, namespace, training_job) (trainprof_gpu_assignment_info)
      and on (uuid)
      count by (uuid) (max by (uuid, namespace, training_job) (trainprof_gpu_assignment_info)) == 1
    )

The right side is 1 for each GPU held by exactly one job, so the alert's value is unchanged
and its job labels become the holder's (replacing the exporter pod's own `namespace`):

- a GPU no job holds has no right-hand series: its alerts never fire;
- a GPU that moves to another job is attributed to the new one from then on; with
  `patience_mode: for` the new job's alert needs the whole patience under the new holder;
- a GPU several jobs hold (time-slicing, MPS, MIG without per-instance UUIDs) is left out of
  the join, so there is no many-to-many error; `TrainprofGPUSharedByJobs` (trainprof.health)
  says which GPU and how many jobs instead.
"""

from __future__ import annotations

from trainprof.contract import metrics as contract
from trainprof.rules import promql

ASSIGNMENT = contract.GPU_ASSIGNMENT_INFO
SHARED_ALERT = "TrainprofGPUSharedByJobs"


def _holders(job_labels: tuple[str, ...], matchers: tuple[promql.Matcher, ...]) -> str:
    """One series per (GPU, job) that holds it."""
    by = ", ".join(("uuid", *job_labels))
    return f"max by ({by}) ({promql.selector(ASSIGNMENT, matchers)})"


def jobs_per_gpu(job_labels: tuple[str, ...], matchers: tuple[promql.Matcher, ...]) -> str:
    return f"count by (uuid) ({_holders(job_labels, matchers)})"


def sole_holder(job_labels: tuple[str, ...], matchers: tuple[promql.Matcher, ...]) -> str:
    """1 per GPU held by exactly one job, labelled with that job."""
    return (
        f"{_holders(job_labels, matchers)}\nand on (uuid)\n"
        f"{jobs_per_gpu(job_labels, matchers)} == 1"
    )


def attribute(expr: str, job_labels: tuple[str, ...], matchers: tuple[promql.Matcher, ...]) -> str:
    """`expr` (one series per uuid) with the job labels of the GPU's only holder."""
    inner = "\n".join("  " + line for line in expr.splitlines())
    holder = "\n".join("  " + line for line in sole_holder(job_labels, matchers).splitlines())
    return f"(\n{inner}\n)\n* on (uuid) group_left ({', '.join(job_labels)})\n(\n{holder}\n)"


def shared_expr(job_labels: tuple[str, ...], matchers: tuple[promql.Matcher, ...]) -> str:
    return f"{jobs_per_gpu(job_labels, matchers)} > 1"


def held_gpus(job: list[str], matchers: tuple[promql.Matcher, ...]) -> str:
    """PromQL counting the GPUs one job holds, for an alert description's "of how many":
    `job` are the job's matchers already rendered (Go format verbs, filled in when the alert
    is evaluated)."""
    parts = [m.render().replace("%", "%%") for m in matchers] + list(job)
    return f"count(count by (uuid) ({ASSIGNMENT}{{{', '.join(parts)}}}))"

"""A small training job served by the real exporter and the real training API, for tests
that need a real Prometheus to scrape something real.

* one `trainprof.exporter` per node, reading fake GPUs through its real NVML code path
  (`fakes.FakeNvml`), a scripted CPU (`fakes.ScriptedCpu`) and scripted memory, disk and
  network counters (psutil reads a process-wide /proc, which other tests point elsewhere
  while this session-wide job runs);
* one process per rank running the real training API in a tiny loop (`live_rank.py`):
  `trainprof.start()` serves a process, so two ranks are two processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import trainprof.exporter
from trainprof.engines.localstack import stop_process
from trainprof.exporter.sources.gpu import GpuSource

from fakes import GIB, FakeGpu, FakeNvml, ScriptedCpu, ScriptedHostCounters

DATAPOINT = 0.5


@dataclasses.dataclass
class Host:
    """What one node does: per-core busy and I/O wait, per-GPU utilization, memory."""

    node: str
    cores: list[float]
    iowait: list[float]
    gpu_util: list[float]
    gpu_memory: list[float]
    memory_jump_after: float | None = None  # seconds; GPU memory +0.3 from then on


@dataclasses.dataclass
class LiveJob:
    training_job: str
    namespace: str
    targets: list[str]  # host:port to scrape
    nodes: list[str]


# A starved GPU next to a busy one on n1 (CPU and I/O bottlenecks, low utilization, load
# imbalance, a small batch, a memory jump after 10 s); a well-fed GPU on n2.
HOSTS = (
    Host(
        "n1",
        cores=[0.97, 0.3, 0.3, 0.3],
        iowait=[0.0, 0.6, 0.0, 0.0],
        gpu_util=[0.03, 0.9],
        gpu_memory=[0.3, 0.5],
        memory_jump_after=10.0,
    ),
    Host("n2", cores=[0.6, 0.6], iowait=[0.0, 0.0], gpu_util=[0.85], gpu_memory=[0.8]),
)


def _exporter(host: Host, training_job: str) -> tuple[trainprof.exporter.Exporter, list]:
    gpus = [
        FakeGpu(
            f"GPU-{host.node}-{i}",
            name="Fake GPU",
            utilization=[round(u * 100)],
            memory_used=int(m * 16 * GIB),
            memory_total=16 * GIB,
        )
        for i, (u, m) in enumerate(zip(host.gpu_util, host.gpu_memory))
    ]
    sources = [
        GpuSource(FakeNvml(gpus)),
        ScriptedCpu([(host.cores, host.iowait)]),
        ScriptedHostCounters(),
    ]
    exporter = trainprof.exporter.start(
        0,
        address="127.0.0.1",
        sources=sources,
        datapoint_interval=DATAPOINT,
        identity={"training_job": training_job, "node": host.node},
    )
    return exporter, gpus


def _rank(
    training_job: str, node: str, rank: int, stall_every: int, workers: int
) -> tuple[subprocess.Popen, int]:
    script = Path(__file__).with_name("live_rank.py")
    kernel_trace = Path(__file__).resolve().parent / "data" / "real-gpu-traces"
    kernel_trace /= "a100-nccl-training.pt.trace.json.gz"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(script),
            training_job,
            node,
            str(rank),
            str(stall_every),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "TRAINPROF_LIVE_KERNEL_TRACE": str(kernel_trace),
            "TRAINPROF_LIVE_WORKERS": str(workers),
        },
    )
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        proc.kill()
        proc.wait()
        proc.stdout.close()
        raise RuntimeError(f"rank {rank} did not start: {line!r}")
    return proc, int(line)


@contextlib.contextmanager
def scripted_job(training_job: str = "bert-base", namespace: str = "team-a") -> Iterator[LiveJob]:
    """Serve one job: a real exporter per node of HOSTS and a real training rank per node,
    rank 1 with stalls (step outliers). The namespace comes from the scrape configuration,
    as Kubernetes relabelling would add it."""
    exporters, ranks, timers = [], [], []
    try:
        targets = []
        for host in HOSTS:
            exporter, gpus = _exporter(host, training_job)
            exporters.append(exporter)
            targets.append(f"127.0.0.1:{exporter.port}")
            if host.memory_jump_after is not None:

                def jump(gpus=gpus):
                    for gpu in gpus:
                        gpu.memory_used += int(0.3 * 16 * GIB)

                timer = threading.Timer(host.memory_jump_after, jump)
                timer.start()
                timers.append(timer)
        for rank, host in enumerate(HOSTS):
            proc, port = _rank(training_job, host.node, rank, 4 if rank else 0, len(host.cores))
            ranks.append(proc)
            targets.append(f"127.0.0.1:{port}")
        yield LiveJob(training_job, namespace, targets, [h.node for h in HOSTS])
    finally:
        for timer in timers:
            timer.cancel()
        for proc in ranks:
            stop_process(proc)
            proc.stdout.close()
        for exporter in exporters:
            exporter.stop()


def scrape_config(job: LiveJob, interval: str = "1s") -> str:
    """Prometheus configuration scraping the job, with its namespace as a target label."""
    targets = ", ".join(f'"{t}"' for t in job.targets)
    return (
        f"global: {{scrape_interval: {interval}, evaluation_interval: {interval}}}\n"
        "rule_files: [rules.yaml]\n"
        "scrape_configs:\n"
        f"- job_name: trainprof\n  static_configs:\n  - targets: [{targets}]\n"
        f"    labels: {{namespace: {job.namespace}}}\n"
    )


@contextlib.contextmanager
def one_rank_job(
    training_job: str, namespace: str = "team-a"
) -> Iterator[tuple[LiveJob, subprocess.Popen]]:
    """One node of HOSTS (a well-fed GPU) and one training rank, yielding the job and the
    rank's process: a test stops the rank to end training while the exporter goes on, as a
    finished job's exporter does."""
    host = HOSTS[1]
    exporter, _ = _exporter(host, training_job)
    proc = None
    try:
        proc, port = _rank(training_job, host.node, 0, 0, len(host.cores))
        targets = [f"127.0.0.1:{exporter.port}", f"127.0.0.1:{port}"]
        yield LiveJob(training_job, namespace, targets, [host.node]), proc
    finally:
        if proc is not None:
            stop_process(proc)
            proc.stdout.close()
        exporter.stop()

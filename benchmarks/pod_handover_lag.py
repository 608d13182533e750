"""How long after a pod takes a GPU its job's gauges carry it, on a live Prometheus (dcgm).

    python benchmarks/pod_handover_lag.py [--handovers 6] [--every 100]

A loopback server serves what dcgm-exporter serves for one GPU (the captured label set of
tests/data/real-exporters, the GPU's `pod` label naming the pod that holds it) and
kube-state-metrics' `kube_pod_labels` for two pods of two jobs. A real Prometheus scrapes it
every 15 s with the rules compiled for `source: dcgm`. Every `--every` seconds (plus a random
part of a scrape interval, so the handovers fall at every phase of the scrapes and of the
device group) the GPU passes to the other pod, and the script polls, once a second, for the
first sample of `gpu_job:trainprof_gpu_utilization:ratio` naming the new job. It prints each
lag and their spread. The per-scrape join reads the job map that `trainprof.sources.devices`
records once a minute, so the lag is up to that minute plus a scrape.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from _procs import serve_exposition
from source_fleet import DCGM, _capture

from trainprof.engines.localstack import prometheus
from trainprof.engines.prometheus_api import PrometheusAPI
from trainprof.generation.render import to_yaml
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config

FIELDS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
PODS = {"worker-a-0": "job-a", "worker-b-0": "job-b"}
JOB_LABEL = "label_training_kubeflow_org_job_name"


def captured_labels() -> dict[str, str]:
    """The captured GPU's labels (from its GPU_UTIL sample), pod and namespace left to set."""
    samples, _ = _capture(DCGM)
    for name, labels, _value in samples:
        if name == "DCGM_FI_DEV_GPU_UTIL":
            return labels
    raise SystemExit(f"{DCGM}: no DCGM_FI_DEV_GPU_UTIL sample")


class Gpu:
    """One GPU held by one pod at a time."""

    def __init__(self) -> None:
        self.labels = {**captured_labels(), "namespace": "default"}
        self.pod = "worker-a-0"

    def body(self) -> bytes:
        labels = {**self.labels, "pod": self.pod}
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        values = {"DCGM_FI_DEV_GPU_UTIL": 50, "DCGM_FI_DEV_FB_USED": 9000}
        lines = [f"{f}{{{text}}} {values.get(f, 11000)}" for f in FIELDS]
        lines += [
            f'kube_pod_labels{{namespace="default",pod="{pod}",{JOB_LABEL}="{job}"}} 1'
            for pod, job in PODS.items()
        ]
        return ("\n".join(lines) + "\n").encode()


def carries(base: str, job: str) -> bool:
    query = f'gpu_job:trainprof_gpu_utilization:ratio{{training_job="{job}"}}'
    return bool(PrometheusAPI(base, timeout=10).query(query)["result"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handovers", type=int, default=6)
    parser.add_argument("--every", type=float, default=100)
    args = parser.parse_args()
    config = {
        "scrape_interval": "15s",
        "source": "dcgm",
        "rules": [{"rule": "LowGPUUtilization"}],
    }
    groups = compile_rules(load_config(config)).groups
    gpu = Gpu()
    server = serve_exposition(gpu.body)
    workdir = Path(tempfile.mkdtemp(prefix="pod-handover-"))
    scrape = (
        "global: {scrape_interval: 15s, evaluation_interval: 15s}\n"
        "rule_files: [rules.yaml]\nscrape_configs:\n- job_name: dcgm\n  static_configs:\n"
        f"  - targets: ['127.0.0.1:{server.server_address[1]}']\n"
    )
    lags = []
    try:
        with prometheus(
            "prometheus", workdir, scrape, {"rules.yaml": to_yaml({"groups": groups})}
        ) as base:
            deadline = time.monotonic() + 180
            while not carries(base, PODS[gpu.pod]):
                if time.monotonic() > deadline:
                    raise SystemExit("the first pod's job never appeared in 3 min")
                time.sleep(1)
            for _ in range(args.handovers):
                time.sleep(args.every + random.uniform(0, 15))
                gpu.pod = next(p for p in PODS if p != gpu.pod)
                handed = time.monotonic()
                while not carries(base, PODS[gpu.pod]):
                    time.sleep(1)
                lags.append(time.monotonic() - handed)
                print(f"  handover to {gpu.pod}: its job after {lags[-1]:.0f} s", flush=True)
    finally:
        server.shutdown()
    print(
        f"{len(lags)} handovers: the new job's gauges after {min(lags):.0f} to "
        f"{max(lags):.0f} s (median {statistics.median(lags):.0f} s)"
    )


if __name__ == "__main__":
    main()

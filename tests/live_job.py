"""A small training job that serves the metric contract's series over HTTP, for tests that
need a real Prometheus to scrape something real.

Until the exporter (`trainprof.exporter`) and the training API (`trainprof.start()`) are on
this branch, both are stand-ins with the contract's names and labels:

* `ScriptedExporter`: the exporter's sample-to-series path itself (`SampleAccumulator`), fed
  with scripted host samples: fake GPUs and scripted CPU, one sample per datapoint interval;
* `FakeTraining`: the training API's shape (`step()`, `phase(name)` context managers, a
  collector) run by a tiny loop thread per rank.

`scripted_job()` is the one place that decides what serves the metrics: swap its body for the
real exporter and training API and every test using the `live_job` fixture follows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

from trainprof import metrics as contract
from trainprof.sampling import GpuSample, HostSample, SampleAccumulator

DATAPOINT = 0.5
GiB = 2**30


@dataclasses.dataclass
class Host:
    """What one node does: per-core busy and I/O wait, per-GPU utilization, memory."""

    node: str
    cores: list[float]
    iowait: list[float]
    gpu_util: list[float]
    gpu_memory: list[float]
    memory_jump_after: float | None = None     # seconds; GPU memory +0.3 from then on


class ScriptedExporter:
    """The exporter's series for one node, from scripted samples taken every 0.5 s."""

    def __init__(self, host: Host, training_job: str, started: float):
        self.host = host
        self.started = started
        self.acc = SampleAccumulator(DATAPOINT, {"training_job": training_job,
                                                 "node": host.node})
        self.lock = threading.Lock()
        self.taken = 0

    def _sample(self, k: int) -> HostSample:
        h, t = self.host, self.started + k * DATAPOINT
        jumped = h.memory_jump_after is not None and k * DATAPOINT >= h.memory_jump_after
        gpus = [GpuSample(i, f"GPU-{h.node}-{i}", utilization=u,
                          memory_used_bytes=(m + (0.3 if jumped else 0)) * 16 * GiB,
                          memory_total_bytes=16 * GiB, power_watts=100 + 200 * u,
                          temperature_celsius=40 + 30 * u, name="Fake GPU",
                          driver_version="0.0")
                for i, (u, m) in enumerate(zip(h.gpu_util, h.gpu_memory))]
        return HostSample(
            timestamp=t, cpu_utilization=h.cores, cpu_iowait=h.iowait,
            memory_used_bytes=40 * GiB, memory_total_bytes=64 * GiB, gpus=gpus,
            disk={"nvme0n1": (k * 1e6, k * 2e5)},
            network={"eth0": (k * 5e6, k * 1e6)})

    def collect(self):
        with self.lock:
            due = int((time.time() - self.started) / DATAPOINT)
            while self.taken < due:
                self.taken += 1
                self.acc.observe(self._sample(self.taken))
            yield from self.acc.families()


class FakeTraining:
    """The training API's series for one rank, with the API's shape: `step()` and
    `phase(name)` context managers. Step outliers are counted as the real API counts them:
    after 100 steps of a mode, a step slower than mean + k standard deviations of the
    earlier ones (Welford), for each k of the contract's grid."""

    def __init__(self, training_job: str, node: str, rank: int):
        self.labels = {"training_job": training_job, "node": node, "rank": str(rank),
                       "local_rank": "0"}
        self.start_time = time.time()
        self.first_step: float | None = None
        self.last_step: float | None = None
        self.steps = 0
        self.buckets = [0] * (len(contract.STEP_DURATION_BUCKETS) + 1)
        self.duration_sum = 0.0
        self.phases: dict[str, float] = {}
        self.outliers = dict.fromkeys(contract.OUTLIER_STDDEVS, 0)
        self._mean = self._m2 = 0.0
        self.lock = threading.Lock()

    @contextlib.contextmanager
    def step(self):
        begin = time.perf_counter()
        if self.first_step is None:
            self.first_step = time.time()
        try:
            yield
        finally:
            self._record(time.perf_counter() - begin)

    @contextlib.contextmanager
    def phase(self, name: str):
        begin = time.perf_counter()
        try:
            yield
        finally:
            with self.lock:
                self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - begin

    def _record(self, seconds: float) -> None:
        with self.lock:
            if self.steps >= 100 and self.steps > 1:
                std = math.sqrt(self._m2 / (self.steps - 1))
                for k in self.outliers:
                    if seconds > self._mean + k * std:
                        self.outliers[k] += 1
            self.steps += 1
            delta = seconds - self._mean
            self._mean += delta / self.steps
            self._m2 += delta * (seconds - self._mean)
            index = next((i for i, b in enumerate(contract.STEP_DURATION_BUCKETS)
                          if seconds <= b), len(contract.STEP_DURATION_BUCKETS))
            self.buckets[index] += 1
            self.duration_sum += seconds
            self.last_step = time.time()

    def collect(self):
        names, values = list(self.labels), list(self.labels.values())
        with self.lock:
            def gauge(name, value):
                family = GaugeMetricFamily(name, contract.metric(name).help, labels=names)
                family.add_metric(values, value)
                return family

            yield gauge("trainprof_training_start_timestamp_seconds", self.start_time)
            if self.first_step is not None:
                yield gauge("trainprof_training_first_step_timestamp_seconds", self.first_step)
                yield gauge("trainprof_training_last_step_timestamp_seconds", self.last_step)
            steps = CounterMetricFamily("trainprof_training_steps",
                                        contract.metric("trainprof_training_steps_total").help,
                                        labels=names + ["mode"])
            steps.add_metric(values + ["train"], self.steps)
            yield steps
            duration = HistogramMetricFamily(
                "trainprof_training_step_duration_seconds",
                contract.metric("trainprof_training_step_duration_seconds").help,
                labels=names + ["mode"])
            cumulative, buckets = 0, []
            for bound, n in zip(contract.STEP_DURATION_BUCKETS, self.buckets):
                cumulative += n
                buckets.append((contract.bucket_label(bound), cumulative))
            buckets.append(("+Inf", self.steps))
            duration.add_metric(values + ["train"], buckets, self.duration_sum)
            yield duration
            outliers = CounterMetricFamily(
                "trainprof_training_step_outliers",
                contract.metric("trainprof_training_step_outliers_total").help,
                labels=names + ["mode", "stddev"])
            for k, n in self.outliers.items():
                outliers.add_metric(values + ["train", contract.threshold_label(k)], n)
            yield outliers
            phases = CounterMetricFamily(
                "trainprof_training_phase_seconds",
                contract.metric("trainprof_training_phase_seconds_total").help,
                labels=names + ["phase"])
            for name, seconds in sorted(self.phases.items()):
                phases.add_metric(values + [name], seconds)
            yield phases


def tiny_loop(api: FakeTraining, stop: threading.Event, slow_every: int = 0) -> None:
    """Steps of about 20 ms (dataloader, forward, backward, optimizer); after 120 steps,
    every `slow_every`-th step stalls for 0.25 s in the dataloader."""
    n = 0
    while not stop.is_set():
        n += 1
        stall = slow_every and n > 120 and n % slow_every == 0
        with api.step():
            with api.phase("dataloader"):
                time.sleep(0.25 if stall else 0.004)
            with api.phase("forward"):
                time.sleep(0.006)
            with api.phase("backward"):
                time.sleep(0.008)
            with api.phase("optimizer"):
                time.sleep(0.002)


@dataclasses.dataclass
class LiveJob:
    training_job: str
    namespace: str
    targets: list[str]                 # host:port to scrape
    nodes: list[str]


class _Collector:
    def __init__(self, source):
        self.source = source

    def collect(self):
        return self.source.collect()

    def describe(self):
        return []


def _serve(source, servers: list) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(source))
    httpd, _ = start_http_server(0, "127.0.0.1", registry)
    servers.append(httpd)
    return f"127.0.0.1:{httpd.server_port}"


# A starved GPU next to a busy one on n1 (CPU and I/O bottlenecks, low utilization, load
# imbalance, a small batch, a memory jump after 10 s); a well-fed GPU on n2.
HOSTS = (
    Host("n1", cores=[0.97, 0.3, 0.3, 0.3], iowait=[0.0, 0.6, 0.0, 0.0],
         gpu_util=[0.03, 0.9], gpu_memory=[0.3, 0.5], memory_jump_after=10.0),
    Host("n2", cores=[0.6, 0.6], iowait=[0.0, 0.0], gpu_util=[0.85], gpu_memory=[0.8]),
)


@contextlib.contextmanager
def scripted_job(training_job: str = "bert-base", namespace: str = "team-a"
                 ) -> Iterator[LiveJob]:
    """Serve one job: an exporter per node of HOSTS and a training rank per node, rank 1
    with stalls (step outliers). The namespace comes from the scrape configuration, as
    Kubernetes relabelling would add it."""
    started = time.time()
    servers: list = []
    stop = threading.Event()
    threads = []
    try:
        targets = [_serve(ScriptedExporter(h, training_job, started), servers) for h in HOSTS]
        for rank, host in enumerate(HOSTS):
            api = FakeTraining(training_job, host.node, rank)
            targets.append(_serve(api, servers))
            thread = threading.Thread(target=tiny_loop, args=(api, stop, 4 if rank else 0),
                                      daemon=True)
            thread.start()
            threads.append(thread)
        yield LiveJob(training_job, namespace, targets, [h.node for h in HOSTS])
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
        for httpd in servers:
            httpd.shutdown()
            httpd.server_close()


def scrape_config(job: LiveJob, interval: str = "1s") -> str:
    """Prometheus configuration scraping the job, with its namespace as a target label."""
    targets = ", ".join(f'"{t}"' for t in job.targets)
    return (f"global: {{scrape_interval: {interval}, evaluation_interval: {interval}}}\n"
            "rule_files: [rules.yaml]\n"
            "scrape_configs:\n"
            f"- job_name: trainprof\n  static_configs:\n  - targets: [{targets}]\n"
            f"    labels: {{namespace: {job.namespace}}}\n")

"""A scripted exporter for end-to-end tests: hosts whose samples a test writes.

Each `ScriptedHost` folds the `HostSample` its script returns into a `SampleAccumulator` every
datapoint interval (the exporter's own sample-to-metrics path) and also serves the training
API's start timestamp and step counter, so rules over both sides can fire. All hosts are served
from one `/metrics` on a free loopback port, families of the same name merged, as one
exporter per host would look after Prometheus scraped them all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from trainprof.contract import metrics as contract
from trainprof.contract.sampling import HostSample, SampleAccumulator


@dataclasses.dataclass
class ScriptedHost:
    identity: dict[str, str]  # namespace, training_job, node
    script: Callable[[float], HostSample]  # seconds since the exporter started -> sample
    started_at: float  # the training process's start (Unix seconds)
    steps: int = 0  # steps completed (stays fixed)
    accumulator: SampleAccumulator | None = None


class _Collector:
    def __init__(self, hosts: list[ScriptedHost], lock: threading.Lock):
        self.hosts, self.lock = hosts, lock
        self.first_scrape: float | None = None  # time.monotonic() of the first scrape

    def collect(self):
        if self.first_scrape is None:
            self.first_scrape = time.monotonic()
        merged: dict[str, object] = {}
        with self.lock:
            families = [f for h in self.hosts for f in h.accumulator.families()]
            families += [f for h in self.hosts for f in _training_families(h)]
        for family in families:
            if family.name in merged:
                merged[family.name].samples.extend(family.samples)
            else:
                merged[family.name] = family
        yield from merged.values()


def _training_families(host: ScriptedHost):
    names = list(host.identity) + ["rank", "local_rank"]
    values = list(host.identity.values()) + ["0", "0"]
    start = GaugeMetricFamily(
        "trainprof_training_start_timestamp_seconds",
        contract.metric("trainprof_training_start_timestamp_seconds").help,
        labels=names,
    )
    start.add_metric(values, host.started_at)
    steps = CounterMetricFamily(
        "trainprof_training_steps",
        contract.metric("trainprof_training_steps_total").help,
        labels=names + ["mode"],
    )
    steps.add_metric(values + ["train"], host.steps)
    return [start, steps]


@contextlib.contextmanager
def scripted_exporter(hosts: list[ScriptedHost], interval: float = 0.5):
    """Serve `hosts`; yields (host:port, collector). Sampling runs on a thread until exit."""
    lock = threading.Lock()
    for host in hosts:
        host.accumulator = SampleAccumulator(interval, host.identity)
    collector = _Collector(hosts, lock)
    registry = CollectorRegistry()
    registry.register(collector)
    stop = threading.Event()
    begin = time.monotonic()

    def sample():
        while not stop.is_set():
            elapsed = time.monotonic() - begin
            with lock:
                for host in hosts:
                    host.accumulator.observe(host.script(elapsed))
            stop.wait(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    server, server_thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{server.server_address[1]}", collector
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

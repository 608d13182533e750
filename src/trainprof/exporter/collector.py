"""Running the sources with health, and the exporter's families for a registry.

`SourceRunner` reads every source into one `HostSample` and keeps each source's health, the way
node_exporter's `execute()` does: a source that raises or reads only part of what it serves
turns into `trainprof_collector_success{collector} 0` for that sample, says so once in the log,
and never fails the sample or the scrape.

With a `timeout`, each source reads in its own thread, and one that has not answered within
`timeout` seconds (a hung NVML call in a driver that lost a GPU) is failed for that sample;
until its call returns, later samples skip it at once (success 0, its duration the time it
has hung so far), so the other sources keep their datapoint interval and `stop()` does not
wait for the hung call.

    # HELP trainprof_collector_success 1 if the collector's last sample succeeded, 0 if ...
    # TYPE trainprof_collector_success gauge
    trainprof_collector_success{collector="gpu",node="n1"} 0.0
    trainprof_collector_success{collector="cpu",node="n1"} 1.0
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.core import Metric as MetricFamily

from trainprof._version import __version__
from trainprof.contract import metrics as contract
from trainprof.contract.sampling import HostSample
from trainprof.exporter.once import Once
from trainprof.exporter.sources.base import Source

log = logging.getLogger("trainprof.exporter")


class _Worker:
    """One source's reading thread: `read` waits at most `timeout` for the source."""

    def __init__(self, source: Source):
        self.source = source
        self._ready = threading.Event()
        self._done = threading.Event()
        self._job: HostSample | None = None
        self.result: bool | BaseException = False
        self.busy_since: float | None = None  # perf_counter of a call still running
        self._thread = threading.Thread(
            target=self._run, name=f"trainprof-source-{source.name}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._ready.wait()
            self._ready.clear()
            job = self._job
            if job is None:
                return
            try:
                self.result = bool(self.source.read(job))
            except BaseException as e:  # noqa: BLE001 - handed to the sampler
                self.result = e
            self.busy_since = None
            self._done.set()

    def read(self, sample: HostSample, timeout: float) -> bool:
        """True/False as the source says; raises what it raised, or TimeoutError."""
        if self.busy_since is not None:
            raise TimeoutError(
                f"still waiting for a call made {time.perf_counter() - self.busy_since:.1f}s ago"
            )
        self._done.clear()
        self._job = sample
        self.busy_since = time.perf_counter()
        self._ready.set()
        if not self._done.wait(timeout):
            raise TimeoutError(f"no answer within {timeout:g}s")
        result = self.result
        if isinstance(result, BaseException):
            raise result
        return result

    def stop(self) -> None:
        if self.busy_since is None:
            self._job = None
            self._ready.set()
            self._thread.join(1.0)


class SourceRunner:
    """Reads all sources into a sample; `health` maps collector -> (success, seconds)."""

    def __init__(
        self,
        sources: Sequence[Source],
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
        timeout: float | None = None,
    ):
        """`timeout`: seconds a source may take (see the module doc); None waits forever."""
        names = [s.name for s in sources]
        if len(set(names)) != len(names):
            raise ValueError(f"two sources share a collector name: {', '.join(names)}")
        self.sources = list(sources)
        self.health: dict[str, tuple[float, float]] = {}
        # Collector -> why it has nothing to read on this host (a source's `unavailable`).
        self.unavailable: dict[str, str] = {}
        self.timeout = timeout
        self._clock = clock
        self._wall_clock = wall_clock
        self._once = Once(log)
        self._workers = {s.name: _Worker(s) for s in self.sources} if timeout else {}

    def _read(self, source: Source, sample: HostSample) -> bool:
        if self.timeout is None:
            return bool(source.read(sample))
        worker = self._workers[source.name]
        # The source fills a sample of its own, copied in only once it has answered: a
        # call that answers after its timeout must not write into a published sample.
        own = HostSample(sample.timestamp)
        complete = worker.read(own, self.timeout)
        for field in dataclasses.fields(HostSample):
            value = getattr(own, field.name)
            if field.name != "timestamp" and value != getattr(HostSample(0.0), field.name):
                setattr(sample, field.name, value)
        return complete

    def sample(self) -> HostSample:
        sample = HostSample(self._wall_clock())
        for source in self.sources:
            start = self._clock()
            try:
                complete = self._read(source, sample)
            except Exception as e:  # noqa: BLE001 - reported as collector_success 0
                complete = False
                self._once.start(
                    source.name,
                    "collector %s failed: %s: %s; its series are left out until it recovers",
                    source.name,
                    type(e).__name__,
                    e,
                    exc_info=e,
                )
            else:
                self._once.end(source.name, "collector %s works again", source.name)
            self.health[source.name] = (1.0 if complete else 0.0, max(self._clock() - start, 0.0))
            why = getattr(source, "unavailable", None)
            if why and not complete:
                self.unavailable[source.name] = why
            else:
                self.unavailable.pop(source.name, None)
        return sample

    def stop_workers(self) -> None:
        """End the reading threads without closing the sources (start() failed)."""
        for worker in self._workers.values():
            worker.stop()

    def close(self) -> None:
        for source in self.sources:
            worker = self._workers.get(source.name)
            if worker is not None:
                if worker.busy_since is not None:
                    log.warning(
                        "collector %s is still in a call that does not return; not closing it",
                        source.name,
                    )
                    continue
                worker.stop()
            try:
                source.close()
            except Exception as e:  # noqa: BLE001 - closing must not stop the others
                log.warning("collector %s did not close cleanly: %s", source.name, e)


def health_families(
    health: Mapping[str, tuple[float, float]],
    identity: Mapping[str, str],
    unavailable: Mapping[str, str] | None = None,
) -> list[MetricFamily]:
    """Collector health and build info, with the identity labels every series carries;
    `unavailable` (collector -> reason) marks a collector with nothing to read on this host.

        trainprof_collector_unavailable{collector="gpu",node="n1",reason="no_nvidia_driver"} 1.0
    """
    names, values = list(identity), list(identity.values())
    build = _gauge(contract.EXPORTER_BUILD_INFO, names + ["version"])
    build.add_metric(values + [__version__], 1)
    success = _gauge(contract.COLLECTOR_SUCCESS, names + ["collector"])
    duration = _gauge(contract.COLLECTOR_DURATION_SECONDS, names + ["collector"])
    for collector, (ok, seconds) in health.items():
        success.add_metric(values + [collector], ok)
        duration.add_metric(values + [collector], seconds)
    absent = _gauge(contract.COLLECTOR_UNAVAILABLE, names + ["collector", "reason"])
    for collector, reason in sorted((unavailable or {}).items()):
        absent.add_metric(values + [collector, reason], 1)
    return [build, success, duration, absent]


def _gauge(name: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, contract.metric(name).help, labels=labels)


class ExporterCollector:
    """The exporter's series for a prometheus_client registry (in-process use).

    `collect()` returns the families of the latest sample; `describe()` returns names only, so
    registering on an auto-describe registry never touches psutil or the NVIDIA driver.
    """

    def __init__(self, families: Callable[[], list[MetricFamily]]):
        self._families = families

    def collect(self) -> list[MetricFamily]:
        return self._families()

    def describe(self) -> list[MetricFamily]:
        return [
            MetricFamily(m.base, m.help, m.type) for m in contract.METRICS if m.source == "exporter"
        ]

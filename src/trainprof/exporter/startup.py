"""`start()`: the sources, sampler, scrape server and recorder wired into a running
`Exporter`, or nothing left running when it fails."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trainprof.exporter.server import DEFAULT_PORT

log = logging.getLogger("trainprof.exporter")

DEFAULT_INTERVAL = 0.5  # seconds: SageMaker's default system_monitor_interval_millis
SOURCE_TIMEOUT = 1.0  # seconds a source (NVML) may take before it counts as failed


class Exporter:
    """A running exporter: `.url` (None without a server), `.stop()`; also a context manager."""

    def __init__(self, sampler, server=None, registry=None, collector=None, recorder=None):
        self.sampler = sampler
        self.server = server
        self._registry = registry
        self._collector = collector
        self._recorder = recorder
        self._stopped = False

    @property
    def url(self) -> str | None:
        return self.server.url + "/metrics" if self.server else None

    @property
    def port(self) -> int | None:
        return self.server.address[1] if self.server else None

    def families(self):
        """The current families (what a scrape would show), for tests and debugging."""
        return self.sampler.families()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and sampling, close the sources and flush the recording."""
        if self._stopped:
            return
        self._stopped = True
        if self._registry is not None and self._collector is not None:
            self._registry.unregister(self._collector)
        if self.server is not None:
            self.server.stop()
        self.sampler.stop(timeout)
        if self._recorder is not None:
            self._recorder.close()

    def abandon_in_forked_child(self) -> None:
        """In a process forked from this one: close the copy of the listening socket (the
        server and sampler threads did not come along) so the port stays the parent's."""
        self._stopped = True
        if self.server is not None:
            self.server.close_socket()

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def rules_inputs(path: str) -> tuple[Any, float]:
    """The threshold pairs and datapoint interval a rule configuration needs:
    (BottleneckGrid, seconds). Raises trainprof.rules.config.ConfigError."""
    from trainprof.contract.sampling import BottleneckGrid
    from trainprof.rules.compiler import required_inputs
    from trainprof.rules.files import read_config

    needs = required_inputs(read_config(path))
    grid = BottleneckGrid.default().including(
        cpu=needs["cpu_bottleneck"], io=needs["io_bottleneck"]
    )
    return grid, float(needs["datapoint_interval"])


def start(
    port: int | None = DEFAULT_PORT,
    *,
    address: str = "",
    registry: Any = None,
    sources: Sequence[Any] | None = None,
    collectors: Iterable[str] | None = None,
    nvml: Any = None,
    datapoint_interval: float | None = None,
    identity: Mapping[str, str] | None = None,
    rules_config: str | None = None,
    grid: Any = None,
    record: str | None = None,
    web: Any = None,
    procfs: str | None = None,
    telemetry_path: str = "/metrics",
    max_connections: int = 64,
) -> Exporter:
    """Start sampling every `datapoint_interval` seconds and serve the result.

    port, address   where to serve /metrics (`address=""`: every interface; port 0: any free
                    port, see `.port`); `port=None` serves nothing (use `registry`)
    registry        a prometheus_client CollectorRegistry to add the exporter's series to;
                    registering calls only a cheap describe(), never psutil or NVML
    sources         source objects (see trainprof.exporter.sources); default: those of
                    `collectors` (default all: cpu, memory, disk, network, gpu), GPU through
                    `nvml` (default: `import pynvml`)
    identity        labels on every series, e.g. {"training_job": "bert", "node": "n1"};
                    default: trainprof.training.identity.exporter_labels() (the ranks' policy)
    rules_config    a rule configuration file: count its off-grid bottleneck thresholds too
                    (or pass `grid`), and sample at its datapoint_interval
    record          write every sample to this recording file (.gz: compressed)
    web             a trainprof.exporter.webconfig.WebConfig (TLS, basic auth)
    procfs          another proc filesystem for the psutil sources; process-wide

    Raises OSError when `port` cannot be bound or `record` cannot be written (the message
    names the address or file), ValueError for bad arguments, ConfigError for a bad
    `rules_config`. Nothing is left running when it raises.
    """
    from trainprof.contract import metrics as contract
    from trainprof.contract.httpserve import listen
    from trainprof.contract.sampling import SampleAccumulator
    from trainprof.exporter.collector import ExporterCollector, SourceRunner
    from trainprof.exporter.exposition import ScrapeBodies
    from trainprof.exporter.recorder import Recorder
    from trainprof.exporter.sampler import Sampler
    from trainprof.exporter.server import MetricsServer
    from trainprof.exporter.sources import collectors as sources_module
    from trainprof.training.identity import exporter_labels

    interval = datapoint_interval
    if rules_config is not None:
        rules_grid, rules_interval = rules_inputs(rules_config)
        grid = grid.including(rules_grid.cpu, rules_grid.io) if grid else rules_grid
        if interval is not None and abs(interval - rules_interval) > 1e-9:
            raise ValueError(
                f"datapoint interval {interval:g}s disagrees with "
                f"{rules_config}'s datapoint_interval {rules_interval:g}s; the "
                "rules would measure windows and patience wrongly"
            )
        interval = rules_interval
    interval = DEFAULT_INTERVAL if interval is None else float(interval)
    if not interval > 0:
        raise ValueError(f"datapoint interval must be longer than 0s, not {interval:g}s")
    if procfs is not None:
        sources_module.set_procfs(procfs)
    labels = dict(identity) if identity is not None else exporter_labels()
    unknown = sorted(set(labels) - set(contract.EXPORTER_IDENTITY))
    if unknown:
        raise ValueError(
            f"identity label {', '.join(unknown)} is not one of "
            f"{', '.join(contract.EXPORTER_IDENTITY)} (job, instance, namespace "
            "and pod belong to the scrape target)"
        )
    if sources is None:
        sources = sources_module.default_sources(
            sources_module.COLLECTORS if collectors is None else collectors, nvml=nvml
        )

    sock = None
    if port is not None:
        where = f"{'[' + address + ']' if ':' in address else address}:{port}"
        try:
            sock = listen(address, port)
        except OSError as e:
            # create_server appends the address to strerror; gaierror's errno is not errno.
            why = (
                e.strerror
                if isinstance(e, socket.gaierror) or not e.errno
                else os.strerror(e.errno)
            )
            raise OSError(e.errno, f"cannot listen on {where}: {why}") from None
    recorder = None
    runner = None
    try:
        if record is not None:
            try:
                recorder = Recorder(record, interval, labels.get("node") or socket.gethostname())
            except OSError as e:
                raise OSError(
                    e.errno, f"cannot write the recording {record}: {e.strerror or e}"
                ) from None
        accumulator = SampleAccumulator(interval, labels, grid)
        runner = SourceRunner(sources, timeout=max(SOURCE_TIMEOUT, 2 * interval))
        sampler = Sampler(runner, accumulator, on_sample=recorder)
        server = None
        if sock is not None:
            bodies = ScrapeBodies(_with_process_metrics(sampler.snapshot), lambda: sampler.samples)
            server = MetricsServer(sock, bodies, web, telemetry_path, max_connections)
        collector = None
        if registry is not None:
            collector = ExporterCollector(sampler.families)
            registry.register(collector)
    except BaseException:
        if runner is not None:
            runner.stop_workers()
        if sock is not None:
            sock.close()
        if recorder is not None:
            recorder.close()
        raise
    sampler.start()
    if server is not None:
        server.start()
        log.info("serving %s every %gs", server.url + telemetry_path, interval)
    return Exporter(sampler, server, registry, collector, recorder)


def _with_process_metrics(snapshot):
    """The exporter's own `process_*` series (CPU, memory, open files, start time) after the
    sample's, as every Prometheus exporter serves them; only on its own port, since a
    registry given to `start()` has its own process collector."""
    from prometheus_client import ProcessCollector

    process = ProcessCollector(registry=None)

    def with_process():
        samples, families = snapshot()
        return samples, families + list(process.collect())

    return with_process

"""The series dcgm-exporter and node_exporter would have served, from a recorded timeline.

`trainprof replay --source dcgm,node_exporter` evaluates the rules compiled for those
exporters, so it must feed them what those exporters serve: their own names, label sets and
units (as in tests/data/real-exporters' captures), scraped every scrape interval.

dcgm-exporter (one target per node, `job="nvidia-dcgm-exporter"`): per GPU
`DCGM_FI_DEV_GPU_UTIL` (whole percent), `DCGM_FI_DEV_FB_USED` and `DCGM_FI_DEV_FB_FREE`
(whole MiB) and the other fields the recording holds (power, temperature, SM clock, energy,
`DCGM_FI_PROF_*` activities), labelled `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`,
`Hostname`, `DCGM_FI_DRIVER_VERSION` and the workload's `namespace`/`pod`/`container` (with
an empty `pod_uid`, as the GPU Operator's capture shows). dcgm-exporter collects every
`collect_interval` (30 s in common GPU Operator setups), half a period out of step with the
scrapes, and each scrape serves what the last collection read: the GPU's state at that
instant, not an average.

node_exporter (`job="node-exporter"`, the node's name in `SourceOptions.node_label`):
`node_cpu_seconds_total{cpu, mode}` counters that advance, between two scrapes, by the time
that passed, split between the modes as the samples read in between were (busy time between
`user` and `system`, then `iowait` and `idle`), in /proc/stat's 10 ms ticks;
`node_memory_MemTotal_bytes` and `node_memory_MemAvailable_bytes`; disk and network byte
counters when the recording has them. A scrape with no new sample since the last one finds
no node_exporter series (a gap in the recording is a missed scrape).

    >>> from trainprof.contract.sampling import GpuSample, HostSample
    >>> from trainprof.replay.series_store import SeriesStore
    >>> from trainprof.replay.timeline import Timeline
    >>> sample = HostSample(60.5, cpu_utilization=[0.8], cpu_iowait=[0.1],
    ...                     memory_used_ratio=0.25, gpus=[GpuSample(0, "gpu0", 0.034, 0.5)])
    >>> timeline = Timeline({"algo-1": [sample]}, "bert", 0.5, ranks=[("algo-1", 0)])
    >>> exporters = Exporters(("dcgm", "node_exporter"))
    >>> store = SeriesStore(count=2)
    >>> exporters.scrape(timeline, store, count=2, scrape_interval=15.0)
    >>> for text, values in store.items():
    ...     name = text.split("{")[0]
    ...     print(text.replace(", ", ",\\n      ") if "UTIL" in name else name, values)
    DCGM_FI_DEV_GPU_UTIL{DCGM_FI_DRIVER_VERSION="unknown",
          Hostname="algo-1",
          UUID="GPU-5f765b0c-f383-5764-8932-acbfd7005b3c",
          container="pytorch",
          device="nvidia0",
          gpu="0",
          instance="algo-1:9400",
          job="nvidia-dcgm-exporter",
          modelName="unknown",
          namespace="default",
          pci_bus_id="00000000:10:00.0",
          pod="bert-worker-0",
          pod_uid=""} _ 3
    DCGM_FI_DEV_FB_USED _ 8192
    DCGM_FI_DEV_FB_FREE _ 8192
    node_cpu_seconds_total _ 0.32
    node_cpu_seconds_total _ 0.08
    node_cpu_seconds_total _ 0.05
    node_cpu_seconds_total _ 0.05
    node_memory_MemTotal_bytes _ 68719476736
    node_memory_MemAvailable_bytes _ 51539607552

(The first scrape, at t0 = 60 s, precedes the sample; the modes are user, system, iowait,
idle; the memory total is nominal, as the sample holds only the used ratio.)

GPUs join their job the way a cluster running trainprof's training API does: each rank
serves `trainprof_gpu_assignment_info{uuid}` for the GPUs it uses (`gpu_assignments`). A
timeline that knows no rank (SageMaker output without framework traces) had no training
process to serve it, so its GPUs join through dcgm-exporter's pod labels and
kube-state-metrics' `kube_pod_labels{<pod_job_label>}` instead, as on a Kubeflow cluster.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import uuid
from collections.abc import Callable, Mapping, Sequence

from trainprof.contract.sampling import GpuSample, HostSample
from trainprof.replay.series_store import SeriesStore
from trainprof.sources.options import SourceOptions

DCGM_JOB, DCGM_PORT = "nvidia-dcgm-exporter", 9400
NODE_JOB, NODE_PORT = "node-exporter", 9100
KSM_TARGET = {"job": "kube-state-metrics", "instance": "kube-state-metrics:8080"}
NAMESPACE, CONTAINER = "default", "pytorch"  # a Kubeflow PyTorchJob's pods
UNKNOWN = "unknown"  # a GPU model or driver the recording does not name
MIB = 1048576
# What a framebuffer or a host's memory holds when the recording has only the used ratio
# (SageMaker's GPUMemoryUtilization and MemoryUsedPercent): the rules read ratios only.
NOMINAL_FB_MIB = 16384
NOMINAL_MEMORY_BYTES = 64 * 1024**3
# /proc/stat counts CPU time in USER_HZ ticks.
TICK = 0.01
# The recording has each core's busy share, not its user/system split: a fixed fifth is
# system time (the rules read busy = every mode but idle and iowait, whatever the split).
SYSTEM_SHARE = 0.2
MIN_COLLECT_INTERVAL = 0.1
MAX_COLLECT_INTERVAL = 3600.0
EPS = 1e-9

# GpuSample attribute -> (dcgm field, factor to dcgm's unit), beyond utilization and memory.
OTHER_FIELDS = (
    ("power_watts", "DCGM_FI_DEV_POWER_USAGE", 1.0),
    ("temperature_celsius", "DCGM_FI_DEV_GPU_TEMP", 1.0),
    ("sm_clock_hertz", "DCGM_FI_DEV_SM_CLOCK", 1e-6),  # MHz
    ("energy_joules", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e3),  # mJ
    ("sm_active", "DCGM_FI_PROF_SM_ACTIVE", 1.0),
    ("sm_occupancy", "DCGM_FI_PROF_SM_OCCUPANCY", 1.0),
    ("tensor_active", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1.0),
    ("dram_active", "DCGM_FI_PROF_DRAM_ACTIVE", 1.0),
)
CPU_MODES = ("user", "system", "iowait", "idle")


def check_sources(
    sources: tuple[str, ...], scrape_interval: float, collect_interval: float | None
) -> None:
    """Refuse a combination replay cannot stand for; ValueError says what to use instead.

    `collect_interval` is dcgm-exporter's collection period, whoever reads it: the rules
    (`dcgm` among `sources`) or trainprof's exporter (`held_gpu_readings`).

    >>> check_sources(("dcgm",), 15, 7)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --collect-interval 7s is neither a multiple nor a divisor of the scrape ...
    """
    if collect_interval is None:
        return
    c, s = collect_interval, scrape_interval
    if not (math.isfinite(c) and MIN_COLLECT_INTERVAL - EPS <= c <= MAX_COLLECT_INTERVAL):
        raise ValueError(
            f"--collect-interval {c:g}s is outside {MIN_COLLECT_INTERVAL:g}s .. "
            f"{MAX_COLLECT_INTERVAL:g}s"
        )
    if not (_whole(c / s) or _whole(s / c)):
        raise ValueError(
            f"--collect-interval {c:g}s is neither a multiple nor a divisor of the scrape "
            f"interval ({s:g}s): dcgm-exporter's value would change between scrapes at no "
            f"fixed pace; use e.g. {s:g}s or {2 * s:g}s"
        )


def _whole(ratio: float) -> bool:
    return round(ratio) >= 1 and abs(ratio - round(ratio)) < 1e-6


def gpu_uuid(training_job: str, node: str, index: int, recorded: str) -> str:
    """The GPU's NVML UUID: as recorded when it is one (`GPU-...`), else a stable made-up
    one (SageMaker names GPUs `gpu0`, ...), unique per job, node and index."""
    if recorded.startswith("GPU-"):
        return recorded
    return "GPU-" + str(
        uuid.uuid5(uuid.NAMESPACE_URL, f"trainprof-replay:{training_job}/{node}/{index}")
    )


def gpu_assignments(
    ranks: Sequence[tuple[str, int]], gpus: Mapping[str, Mapping[int, str]]
) -> dict[tuple[str, int], list[tuple[str, str]]]:
    """The (index, UUID) pairs each rank uses: a node's GPUs split in order among its ranks
    in rank order (one each with a process per GPU; all of them for a single process).

    >>> gpu_assignments([("n", 0), ("n", 1)], {"n": {0: "GPU-a", 1: "GPU-b", 2: "GPU-c"}})
    {('n', 0): [('0', 'GPU-a'), ('1', 'GPU-b')], ('n', 1): [('2', 'GPU-c')]}
    """
    by_node: dict[str, list[int]] = {}
    for node, rank in sorted(set(ranks)):
        by_node.setdefault(node, []).append(rank)
    out: dict[tuple[str, int], list[tuple[str, str]]] = {}
    for node, node_ranks in by_node.items():
        indices = sorted(gpus.get(node, {}))
        for j, index in enumerate(indices):
            rank = node_ranks[j * len(node_ranks) // len(indices)]
            out.setdefault((node, rank), []).append((str(index), gpus[node][index]))
    return out


@dataclasses.dataclass
class _Ids:
    """Series ids of one target, looked up once per key."""

    store: SeriesStore
    target: dict[str, str]
    ids: dict[tuple, int] = dataclasses.field(default_factory=dict)

    def put(self, key: tuple, name: str, labels: Callable[[], dict[str, str]], k: int, v) -> None:
        found = self.ids.get(key)
        if found is None:
            found = self.ids[key] = self.store.id_of(name, {**labels(), **self.target})
        self.store.put(found, k, v)


@dataclasses.dataclass(frozen=True)
class Exporters:
    """The exporters a replay stands for, and how they are deployed.

    sources: as `RulesConfig.source`; trainprof's own exporter is served unless dcgm and
        node_exporter together replace it.
    options: the scrape configuration the rules were compiled for (node label, job label of
        kube-state-metrics' pods).
    collect_interval: dcgm-exporter's collection period; None: every scrape.
    """

    sources: tuple[str, ...]
    options: SourceOptions = SourceOptions()
    collect_interval: float | None = None

    @property
    def dcgm(self) -> bool:
        return "dcgm" in self.sources

    @property
    def node_exporter(self) -> bool:
        return "node_exporter" in self.sources

    @property
    def trainprof(self) -> bool:
        """Whether trainprof's own exporter runs beside them."""
        return not (self.dcgm and self.node_exporter)

    def gpus(self, timeline) -> dict[str, dict[int, str]]:
        """{node: {GPU index: UUID}} of every GPU the timeline's samples show: dcgm's (made
        up where the recording has no NVML UUID), else the one trainprof's exporter serves."""
        out: dict[str, dict[int, str]] = {}
        for node, samples in timeline.hosts.items():
            recorded: dict[int, str] = {}
            if hasattr(samples, "gpu_indices"):  # CompactSamples names its GPUs gpuN
                recorded = {i: f"gpu{i}" for i in samples.gpu_indices()}
            else:
                for s in samples:
                    for g in s.gpus:
                        if not recorded.get(g.index):
                            recorded[g.index] = g.uuid
            out[node] = {
                i: gpu_uuid(timeline.training_job, node, i, u) if self.dcgm else u
                for i, u in sorted(recorded.items())
            }
        return out

    def assignments(self, timeline) -> dict[tuple[str, int], list[tuple[str, str]]]:
        """What each rank's training API serves as `trainprof_gpu_assignment_info`."""
        return gpu_assignments(timeline.ranks, self.gpus(timeline))

    def by_pods(self, timeline) -> bool:
        """Whether GPUs join the job through their pods (no rank is known to serve its GPU
        assignment); the replayed cluster is then Kubernetes, with the job's namespace on
        trainprof's exporter too."""
        return self.dcgm and not timeline.ranks and bool(self.options.pod_job_label)

    def scrape(
        self,
        timeline,
        store: SeriesStore,
        count: int,
        scrape_interval: float,
        advance: Callable[[int], None] | None = None,
    ) -> None:
        """Every node's dcgm-exporter and node_exporter series at each of `count` scrape
        instants (t0 + k * scrape_interval) into `store`; `advance(n)` as samples are read.
        With no rank known, kube-state-metrics' `kube_pod_labels` for the job's pods too."""
        t0 = timeline.start
        uuids = self.gpus(timeline) if self.dcgm else {}
        pods = {
            node: f"{timeline.training_job}-worker-{n}"
            for n, node in enumerate(sorted(timeline.hosts))
        }
        for node, samples in sorted(timeline.hosts.items()):
            host = _Host(self, node, pods[node], uuids.get(node, {}), store)
            host.scrape(samples, timeline.datapoint_interval, t0, count, scrape_interval, advance)
        if self.by_pods(timeline):
            ksm = _Ids(store, KSM_TARGET)
            for node in sorted(timeline.hosts):
                labels = {
                    "namespace": NAMESPACE,
                    "pod": pods[node],
                    "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, pods[node])),
                    self.options.pod_job_label: timeline.training_job,
                }
                for k in range(count):
                    ksm.put((node,), "kube_pod_labels", functools.partial(dict, labels), k, 1)


class _Host:
    """One node's dcgm-exporter and node_exporter, scraped in time order."""

    def __init__(
        self, exporters: Exporters, node: str, pod: str, uuids: Mapping[int, str], store
    ) -> None:
        self.exporters, self.node, self.pod, self.uuids = exporters, node, pod, uuids
        node_target = {"job": NODE_JOB, "instance": f"{node}:{NODE_PORT}"}
        if exporters.options.node_label != "instance":
            node_target[exporters.options.node_label] = node
        self.dcgm = _Ids(store, {"job": DCGM_JOB, "instance": f"{node}:{DCGM_PORT}"})
        self.node_exporter = _Ids(store, node_target)
        self.cpu_seconds: list[list[float]] = []  # per core, seconds in each of CPU_MODES
        # Per core since its last scrape: each mode's share times the samples' duration, and
        # (last) their total duration; and when it was last scraped.
        self.cpu_pending: list[list[float]] = []
        self.cpu_scraped: list[float | None] = []

    def scrape(self, samples, dt, t0, count, scrape_interval, advance) -> None:
        times = getattr(samples, "times", None) or [s.timestamp for s in samples]
        collect = self.exporters.collect_interval or scrape_interval
        # dcgm-exporter's timer is not Prometheus': its collections fall half a period
        # before the scrapes they line up with, the average age of an unsynchronised one.
        next_collection = t0 - collect / 2
        latest: dict[int, GpuSample] = {}  # each GPU's newest reading
        collected: dict[int, GpuSample] = {}  # what the last collection read
        host: HostSample | None = None
        i = 0
        for k in range(count):
            instant = t0 + k * scrape_interval
            before = i
            while i < len(times) and times[i] <= instant + EPS:
                while next_collection < times[i] - EPS:
                    collected, next_collection = dict(latest), next_collection + collect
                host = samples[i]
                for gpu in host.gpus:
                    latest[gpu.index] = gpu
                self._integrate(host, dt)
                i += 1
            while next_collection <= instant + EPS:
                collected, next_collection = dict(latest), next_collection + collect
            if advance is not None:
                advance(i - before)
            if host is None:
                continue  # no data yet: the recording starts later
            if self.exporters.dcgm:
                for index, gpu in sorted(collected.items()):
                    self._put_gpu(k, index, gpu)
            if self.exporters.node_exporter and i > before:
                self._put_host(k, instant, host)

    def _integrate(self, sample: HostSample, dt: float) -> None:
        cores, iowait = sample.cpu_utilization, sample.cpu_iowait
        while len(self.cpu_pending) < len(cores):
            self.cpu_seconds.append([0.0] * len(CPU_MODES))
            self.cpu_pending.append([0.0] * (len(CPU_MODES) + 1))
            self.cpu_scraped.append(None)
        for c, busy in enumerate(cores):
            if busy != busy:
                continue  # not read in this sample
            busy = min(max(busy, 0.0), 1.0)
            wait = iowait[c] if c < len(iowait) and iowait[c] == iowait[c] else 0.0
            wait = min(max(wait, 0.0), 1.0 - busy)
            pending = self.cpu_pending[c]
            pending[0] += busy * (1 - SYSTEM_SHARE) * dt
            pending[1] += busy * SYSTEM_SHARE * dt
            pending[2] += wait * dt
            pending[3] += (1.0 - busy - wait) * dt
            pending[4] += dt

    def _advance_cores(self, instant: float) -> list[int]:
        """Advance each core read since its last scrape by the time since then, split as its
        samples were: a kernel counts every tick in some mode, so a core's modes add up to the
        time that passed (the rules rely on it), however many samples fell in between. The
        first scrape of a core counts only its samples' own duration. The cores advanced."""
        advanced = []
        for c, pending in enumerate(self.cpu_pending):
            weight = pending[-1]
            if weight <= 0:
                continue  # no sample read this core: its counters are not served this scrape
            last = self.cpu_scraped[c]
            scale = (instant - last) / weight if last is not None else 1.0
            seconds = self.cpu_seconds[c]
            for m in range(len(CPU_MODES)):
                seconds[m] += pending[m] * scale
            self.cpu_pending[c] = [0.0] * len(pending)
            self.cpu_scraped[c] = instant
            advanced.append(c)
        return advanced

    def _gpu_labels(self, index: int, gpu: GpuSample) -> dict[str, str]:
        return {
            "gpu": str(index),
            "UUID": self.uuids.get(index, ""),
            "pci_bus_id": f"00000000:{0x10 + index:02X}:00.0",
            "device": f"nvidia{index}",
            "modelName": gpu.name or UNKNOWN,
            "Hostname": self.node,
            "DCGM_FI_DRIVER_VERSION": gpu.driver_version or UNKNOWN,
            "container": CONTAINER,
            "namespace": NAMESPACE,
            "pod": self.pod,
            "pod_uid": "",
        }

    def _put_gpu(self, k: int, index: int, gpu: GpuSample) -> None:
        labels = lambda: self._gpu_labels(index, gpu)  # noqa: E731 - built once per series
        put = self.dcgm.put
        if gpu.utilization is not None and gpu.utilization == gpu.utilization:
            put((index, "util"), "DCGM_FI_DEV_GPU_UTIL", labels, k, round(gpu.utilization * 100))
        memory = _framebuffer_mib(gpu)
        if memory is not None:
            used, total = memory
            put((index, "used"), "DCGM_FI_DEV_FB_USED", labels, k, used)
            put((index, "free"), "DCGM_FI_DEV_FB_FREE", labels, k, total - used)
        for attr, field, factor in OTHER_FIELDS:
            value = getattr(gpu, attr)
            if value is not None and value == value:
                put((index, field), field, labels, k, value * factor)

    def _put_host(self, k: int, instant: float, host: HostSample) -> None:
        """node_exporter's series at scrape `k`: only after a sample was read since the last
        scrape (a gap in the recording is a missed scrape, not a host frozen in time)."""
        put = self.node_exporter.put
        for c in self._advance_cores(instant):
            for mode, value in zip(CPU_MODES, self.cpu_seconds[c]):
                put(
                    (c, mode),
                    "node_cpu_seconds_total",
                    functools.partial(dict, cpu=str(c), mode=mode),
                    k,
                    round(math.floor(value / TICK + 1e-6) * TICK, 2),
                )
        memory = _memory_bytes(host)
        if memory is not None:
            used, total = memory
            put(("total",), "node_memory_MemTotal_bytes", dict, k, total)
            put(("available",), "node_memory_MemAvailable_bytes", dict, k, total - used)
        for kind, devices in (("disk", host.disk), ("network", host.network)):
            names = (
                ("node_disk_read_bytes_total", "node_disk_written_bytes_total")
                if kind == "disk"
                else ("node_network_receive_bytes_total", "node_network_transmit_bytes_total")
            )
            for device, pair in sorted(devices.items()):
                for name, value in zip(names, pair):
                    put((name, device), name, functools.partial(dict, device=device), k, value)


def _framebuffer_mib(gpu: GpuSample) -> tuple[int, int] | None:
    """(used, total) in whole MiB, as dcgm reports the framebuffer."""
    total = round(gpu.memory_total_bytes / MIB) if gpu.memory_total_bytes else NOMINAL_FB_MIB
    if gpu.memory_used_bytes is not None and gpu.memory_total_bytes:
        used = round(gpu.memory_used_bytes / MIB)
    else:
        ratio = gpu.memory_ratio()
        if ratio is None or ratio != ratio:
            return None
        used = round(min(max(ratio, 0.0), 1.0) * total)
    return min(used, total), total


def _memory_bytes(host: HostSample) -> tuple[int, int] | None:
    """(used, total) bytes in whole KiB, as /proc/meminfo counts them."""
    total = host.memory_total_bytes or NOMINAL_MEMORY_BYTES
    if host.memory_used_bytes is not None and host.memory_total_bytes:
        used = host.memory_used_bytes
    else:
        ratio = host.memory_ratio()
        if ratio is None or ratio != ratio:
            return None
        used = min(max(ratio, 0.0), 1.0) * total
    kib = lambda v: int(round(v / 1024)) * 1024  # noqa: E731
    return kib(used), kib(total)


def held_gpu_readings(
    samples: Sequence[HostSample], collect_interval: float, t0: float
) -> Sequence[HostSample]:
    """`samples` as trainprof's exporter sees them when it reads its GPUs from a dcgm-exporter
    collecting every `collect_interval` (`--collector.gpu.dcgm-exporter`): each sample's GPU
    readings are those of the last collection before it, which fall half a period before the
    scrape instants from `t0` (as in `_Host.scrape`); no GPU before the first collection. The
    exporter's own polling delay (a second by default) is left out.

    >>> def at(t, util):
    ...     return HostSample(t, gpus=[GpuSample(0, utilization=util)])
    >>> held = held_gpu_readings([at(t, t / 100) for t in (0, 4, 8, 12, 16)], 10, 0)
    >>> [[g.utilization for g in s.gpus] for s in held]  # collections at 5 s and 15 s
    [[], [], [0.04], [0.04], [0.12]]
    """
    from trainprof.replay.compact import CompactSamples

    out: CompactSamples | list[HostSample] = (
        CompactSamples() if isinstance(samples, CompactSamples) else []
    )
    next_collection = t0 - collect_interval / 2
    latest: dict[int, GpuSample] = {}
    collected: list[GpuSample] = []
    for sample in samples:
        while next_collection < sample.timestamp - EPS:
            collected = [latest[i] for i in sorted(latest)]
            next_collection += collect_interval
        for gpu in sample.gpus:
            latest[gpu.index] = gpu
        out.append(dataclasses.replace(sample, gpus=collected))
    return out

"""From host samples to the exporter's series: the one sample-to-metrics path.

The live exporter, `trainprof replay` and the rule tests all feed `HostSample`s (one every
datapoint interval) into a `SampleAccumulator` and read its metric families, so a rule sees the
same series whether the samples came from psutil and NVML a moment ago or from a SageMaker
profiler file of last year.

    >>> acc = SampleAccumulator(interval=0.5, identity={"node": "n1"})
    >>> acc.observe(HostSample(0.5, cpu_utilization=[0.95, 0.1],
    ...                        gpus=[GpuSample(0, "GPU-a", utilization=0.03)]))
    >>> acc.value("trainprof_cpu_bottleneck_samples_total", cpu_above="0.9", gpu_below="0.1")
    1
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.core import (
    Metric as MetricFamily,
)
from prometheus_client.samples import Sample

from trainprof.contract import metrics as contract
from trainprof.contract.metrics import bucket_label, threshold_label


def _used_ratio(ratio: float | None, used: float | None, total: float | None) -> float | None:
    """A given ratio, else used / total when both are known."""
    if ratio is not None:
        return ratio
    if used is not None and total:
        return used / total
    return None


@dataclasses.dataclass
class GpuSample:
    """One GPU's readings in one sample. None means "could not be read"; ratios are 0..1."""

    index: int
    uuid: str = ""
    utilization: float | None = None
    memory_used_ratio: float | None = None  # derived from the bytes when both are known
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    power_watts: float | None = None
    energy_joules: float | None = None  # cumulative, as NVML reports it
    temperature_celsius: float | None = None
    sm_clock_hertz: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    name: str = ""
    driver_version: str = ""

    def memory_ratio(self) -> float | None:
        return _used_ratio(self.memory_used_ratio, self.memory_used_bytes, self.memory_total_bytes)


@dataclasses.dataclass
class HostSample:
    """Everything sampled on one host at one instant (Unix seconds)."""

    timestamp: float
    cpu_utilization: Sequence[float] = ()  # per logical core
    cpu_iowait: Sequence[float] = ()  # per logical core
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    memory_used_ratio: float | None = None
    gpus: Sequence[GpuSample] = ()
    disk: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    network: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)

    def memory_ratio(self) -> float | None:
        return _used_ratio(self.memory_used_ratio, self.memory_used_bytes, self.memory_total_bytes)


@dataclasses.dataclass(frozen=True)
class BottleneckGrid:
    """The (busy, gpu_below) threshold pairs counted per sample, as ratios."""

    cpu: tuple[tuple[float, float], ...]
    io: tuple[tuple[float, float], ...]

    @classmethod
    def default(cls) -> BottleneckGrid:
        pairs = tuple(itertools.product(contract.BUSY_THRESHOLDS, contract.GPU_IDLE_THRESHOLDS))
        return cls(cpu=pairs, io=pairs)

    def including(
        self, cpu: Iterable[tuple[float, float]] = (), io: Iterable[tuple[float, float]] = ()
    ) -> BottleneckGrid:
        """This grid plus extra pairs (those a rule configuration needs)."""
        return BottleneckGrid(cpu=_merged(self.cpu, cpu), io=_merged(self.io, io))


def _merged(pairs, extra):
    return tuple(sorted(set(pairs) | {(float(a), float(b)) for a, b in extra}))


class Histogram:
    """Fixed-bucket histogram state: per-bucket counts (not cumulative), sum, count."""

    __slots__ = ("bounds", "les", "counts", "sum", "count")

    def __init__(self, bounds: Sequence[float]):
        self.bounds = bounds
        self.les = bucket_labels(tuple(bounds))
        self.counts = [0] * (len(bounds) + 1)  # the last slot is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def add_to(self, family: HistogramMetricFamily, labels: list[str]) -> None:
        add_histogram(family, labels, self.les, self.counts, self.count, self.sum)

    def quantile(self, q: float) -> float:
        """The `q` quantile as Prometheus' `histogram_quantile` computes it from these buckets.

        >>> h = Histogram((0.0, 0.5, 1.0))
        >>> for v in (0.2, 0.4, 0.6, 0.9):
        ...     h.observe(v)
        >>> h.quantile(0.5), h.quantile(0.99)
        (0.5, 0.99)
        """
        return self.quantiles((q,), list(itertools.accumulate(self.counts)))[0]

    def quantiles(self, qs: Iterable[float], cumulative: list[int]) -> list[float]:
        """`quantile` of each of `qs`, given the cumulative counts (bounds, then +Inf):
        `contract.quantiles.histogram_quantile`'s arithmetic step by step, its bucket found
        by bisection (the counts only grow; tests/test_sampling.py holds the two equal)."""
        count = self.count
        bounds = self.bounds
        last = len(cumulative) - 1  # the +Inf bucket
        out = []
        for q in qs:
            if not count > 0:
                out.append(math.nan)
                continue
            rank = q * count
            b = bisect.bisect_left(cumulative, rank)
            if b >= last:
                out.append(bounds[-1])
                continue
            end, n = bounds[b], cumulative[b]
            if b == 0 and end <= 0:
                out.append(end)
                continue
            start = 0.0
            if b > 0:
                start, below = bounds[b - 1], cumulative[b - 1]
                n -= below
                rank -= below
            out.append(start + (end - start) * (rank / n) if n else math.nan)
        return out


@functools.lru_cache(maxsize=None)
def bucket_labels(bounds: tuple[float, ...]) -> tuple[str, ...]:
    return tuple(bucket_label(b) for b in bounds)


def add_histogram(
    family: HistogramMetricFamily,
    labels: list[str],
    les: Sequence[str],
    counts: Sequence[int],
    count: int,
    total: float,
) -> None:
    """Per-bucket `counts` (bounds labelled `les`, then +Inf) as one cumulative histogram
    sample of `family`."""
    cumulative, buckets = 0, []
    for le, n in zip(les, counts):
        cumulative += n
        buckets.append((le, cumulative))
    buckets.append(("+Inf", count))
    family.add_metric(labels, buckets, total)


@dataclasses.dataclass
class _GpuState:
    utilization: Histogram
    memory: Histogram
    load_bins: list[int]
    latest: GpuSample | None = None


_GPU_GAUGES = (
    (contract.GPU_UTILIZATION_RATIO, "utilization"),
    (contract.GPU_MEMORY_USED_BYTES, "memory_used_bytes"),
    (contract.GPU_MEMORY_TOTAL_BYTES, "memory_total_bytes"),
    (contract.GPU_POWER_WATTS, "power_watts"),
    (contract.GPU_TEMPERATURE_CELSIUS, "temperature_celsius"),
    (contract.GPU_SM_CLOCK_HERTZ, "sm_clock_hertz"),
    (contract.GPU_SM_ACTIVE_RATIO, "sm_active"),
    (contract.GPU_SM_OCCUPANCY_RATIO, "sm_occupancy"),
    (contract.GPU_TENSOR_ACTIVE_RATIO, "tensor_active"),
    (contract.GPU_DRAM_ACTIVE_RATIO, "dram_active"),
)


class SampleAccumulator:
    """Folds host samples into the exporter's gauges, histograms and counters.

    Not thread-safe: one sampler thread observes and renders.
    """

    def __init__(
        self,
        interval: float,
        identity: Mapping[str, str] | None = None,
        grid: BottleneckGrid | None = None,
    ):
        self.interval = interval
        self.identity = dict(identity or {})
        self.grid = grid or BottleneckGrid.default()
        self.samples = 0
        self.latest: HostSample | None = None
        bounds = contract.UTILIZATION_BUCKETS
        self._cpu = Histogram(bounds)
        self._iowait = Histogram(bounds)
        self._memory = Histogram(bounds)
        self._cpu_bottlenecks = dict.fromkeys(self.grid.cpu, 0)
        self._io_bottlenecks = dict.fromkeys(self.grid.io, 0)
        self._gpus: dict[int, _GpuState] = {}
        # Every GPU's samples pooled per host: the node-level percentiles without a fleet-wide
        # `sum without (gpu, uuid)` over the per-GPU buckets at every evaluation.
        self._pooled_utilization = Histogram(bounds)
        self._pooled_memory = Histogram(bounds)

    def observe(self, sample: HostSample) -> None:
        self.samples += 1
        self.latest = sample
        cores, iowait = sample.cpu_utilization, sample.cpu_iowait
        if cores:
            self._cpu.observe(sum(cores) / len(cores))
        if iowait:
            self._iowait.observe(sum(iowait) / len(iowait))
        memory = sample.memory_ratio()
        if memory is not None:
            self._memory.observe(memory)

        gpu_utils = []
        for gpu in sample.gpus:
            state = self._gpu_state(gpu.index)
            state.latest = gpu
            if gpu.utilization is not None:
                gpu_utils.append(gpu.utilization)
                state.utilization.observe(gpu.utilization)
                self._pooled_utilization.observe(gpu.utilization)
                state.load_bins[_load_bin(gpu.utilization)] += 1
            ratio = gpu.memory_ratio()
            if ratio is not None:
                state.memory.observe(ratio)
                self._pooled_memory.observe(ratio)

        # A bottleneck needs one starved GPU and one saturated core in the same sample.
        if gpu_utils:
            idlest = min(gpu_utils)
            if cores:
                _count_pairs(self._cpu_bottlenecks, max(cores), idlest)
            if iowait:
                _count_pairs(self._io_bottlenecks, max(iowait), idlest)

    def _gpu_state(self, index: int) -> _GpuState:
        state = self._gpus.get(index)
        if state is None:
            bounds = contract.UTILIZATION_BUCKETS
            state = self._gpus[index] = _GpuState(
                Histogram(bounds), Histogram(bounds), [0] * contract.LOAD_BALANCING_BINS
            )
        return state

    # --- rendering ---------------------------------------------------------------------

    def families(self) -> Iterator[MetricFamily]:
        """Every metric family of the exporter's sample state, as prometheus_client objects."""
        ident_names = list(self.identity)
        ident = list(self.identity.values())
        fam = Families(ident_names)

        yield fam.gauge(contract.SAMPLER_INTERVAL_SECONDS, [], [(ident, self.interval)])
        yield fam.counter(contract.SAMPLES_TOTAL, [], [(ident, self.samples)])

        latest = self.latest
        cores = list(latest.cpu_utilization) if latest else []
        iowait = list(latest.cpu_iowait) if latest else []
        if cores:
            yield fam.gauge(contract.CPU_CORES, [], [(ident, len(cores))])
            yield fam.gauge(
                contract.CPU_CORE_UTILIZATION_RATIO,
                ["cpu"],
                [(ident + [str(i)], v) for i, v in enumerate(cores)],
            )
        if iowait:
            yield fam.gauge(
                contract.CPU_CORE_IOWAIT_RATIO,
                ["cpu"],
                [(ident + [str(i)], v) for i, v in enumerate(iowait)],
            )
        # The busiest core, so a fleet's rules read one series per node, not one per core.
        if cores:
            yield fam.gauge(contract.CPU_BUSIEST_CORE_UTILIZATION_RATIO, [], [(ident, max(cores))])
        if iowait:
            yield fam.gauge(contract.CPU_BUSIEST_CORE_IOWAIT_RATIO, [], [(ident, max(iowait))])
        yield fam.histogram(contract.CPU_UTILIZATION_SAMPLED_RATIO, [], [(ident, self._cpu)])
        yield fam.quantiles(contract.CPU_UTILIZATION_QUANTILE_RATIO, ident, self._cpu)
        yield fam.histogram(contract.CPU_IOWAIT_SAMPLED_RATIO, [], [(ident, self._iowait)])
        yield fam.quantiles(contract.CPU_IOWAIT_QUANTILE_RATIO, ident, self._iowait)
        yield fam.counter(
            contract.CPU_BOTTLENECK_SAMPLES_TOTAL,
            ["cpu_above", "gpu_below"],
            [
                (ident + [threshold_label(c), threshold_label(g)], n)
                for (c, g), n in self._cpu_bottlenecks.items()
            ],
        )
        yield fam.counter(
            contract.IO_BOTTLENECK_SAMPLES_TOTAL,
            ["iowait_above", "gpu_below"],
            [
                (ident + [threshold_label(c), threshold_label(g)], n)
                for (c, g), n in self._io_bottlenecks.items()
            ],
        )

        yield from fam.known(
            contract.MEMORY_USED_BYTES, ident, latest.memory_used_bytes if latest else None
        )
        yield from fam.known(
            contract.MEMORY_TOTAL_BYTES, ident, latest.memory_total_bytes if latest else None
        )
        yield fam.histogram(contract.MEMORY_USED_SAMPLED_RATIO, [], [(ident, self._memory)])
        yield fam.quantiles(contract.MEMORY_USED_QUANTILE_RATIO, ident, self._memory)

        # Each device's two byte counters: read and written, received and transmitted.
        disk, network = (latest.disk, latest.network) if latest else ({}, {})
        for counters, totals in (
            ((contract.DISK_READ_BYTES_TOTAL, contract.DISK_WRITTEN_BYTES_TOTAL), disk),
            (
                (contract.NETWORK_RECEIVE_BYTES_TOTAL, contract.NETWORK_TRANSMIT_BYTES_TOTAL),
                network,
            ),
        ):
            devices = sorted(totals.items())
            if not devices:
                continue
            for i, name in enumerate(counters):
                yield fam.counter(name, ["device"], [(ident + [d], pair[i]) for d, pair in devices])

        yield from self._gpu_families(fam, ident)

    def _gpu_families(self, fam: Families, ident: list[str]) -> Iterator[MetricFamily]:
        if not self._gpus:
            return
        present = {g.index for g in self.latest.gpus} if self.latest else set()
        states = sorted(self._gpus.items())
        labels = {i: ident + [str(i), (s.latest.uuid if s.latest else "")] for i, s in states}
        gpu = ["gpu", "uuid"]

        yield fam.gauge(
            contract.GPU_INFO,
            gpu + ["name", "driver_version"],
            [
                (labels[i] + [s.latest.name, s.latest.driver_version], 1)
                for i, s in states
                if i in present and s.latest is not None
            ],
        )
        for name, attr in _GPU_GAUGES:
            rows = [
                (labels[i], getattr(s.latest, attr))
                for i, s in states
                if i in present and getattr(s.latest, attr) is not None
            ]
            if rows:
                yield fam.gauge(name, gpu, rows)
        energy = [
            (labels[i], s.latest.energy_joules)
            for i, s in states
            if i in present and s.latest is not None and s.latest.energy_joules is not None
        ]
        if energy:
            yield fam.counter(contract.GPU_ENERGY_JOULES_TOTAL, gpu, energy)
        yield fam.histogram(
            contract.GPU_UTILIZATION_SAMPLED_RATIO,
            gpu,
            [(labels[i], s.utilization) for i, s in states],
        )
        yield fam.histogram(
            contract.GPU_MEMORY_USED_SAMPLED_RATIO,
            gpu,
            [(labels[i], s.memory) for i, s in states],
        )
        yield fam.histogram(
            contract.NODE_GPU_UTILIZATION_SAMPLED_RATIO, [], [(ident, self._pooled_utilization)]
        )
        yield fam.quantiles(
            contract.NODE_GPU_UTILIZATION_QUANTILE_RATIO, ident, self._pooled_utilization
        )
        yield fam.histogram(
            contract.NODE_GPU_MEMORY_USED_SAMPLED_RATIO, [], [(ident, self._pooled_memory)]
        )
        yield fam.quantiles(
            contract.NODE_GPU_MEMORY_USED_QUANTILE_RATIO, ident, self._pooled_memory
        )
        distances = []
        for (a, sa), (b, sb) in itertools.combinations(states, 2):
            d = js_distance(sa.load_bins, sb.load_bins)
            if d is not None:
                distances.append((labels[a] + labels[b][-2:], d))
        if distances:
            yield fam.gauge(
                contract.GPU_UTILIZATION_JS_DISTANCE, gpu + ["peer_gpu", "peer_uuid"], distances
            )

    def value(self, name: str, **labels: str) -> float | None:
        """One sample's value by exposed sample name and labels (tests and debugging)."""
        return sample_value(self.families(), name, **labels)

    # --- the same samples as a row of values, for replay ---------------------------------

    def row(self) -> tuple[tuple, list[float]]:
        """(shape, values): the value of each sample `families()` gives, in its order,
        without building them. Samples of equal shapes have equal names and labels, so
        replay, which reads every series at every scrape, names them once per shape
        (`samples_of(families())`) and takes the values from here (tests/test_sampling.py
        holds the two to the same values). A tenth of the cost of `families()`."""
        latest = self.latest
        values: list[float] = [self.interval, self.samples]
        cores = list(latest.cpu_utilization) if latest else []
        iowait = list(latest.cpu_iowait) if latest else []
        if cores:
            values.append(len(cores))
            values += cores
        values += iowait
        if cores:
            values.append(max(cores))
        if iowait:
            values.append(max(iowait))
        quantiled: list[bool] = []
        _histogram_row(values, self._cpu, quantiled)
        _histogram_row(values, self._iowait, quantiled)
        values += self._cpu_bottlenecks.values()
        values += self._io_bottlenecks.values()
        used = total = None
        if latest:
            used, total = latest.memory_used_bytes, latest.memory_total_bytes
        if used is not None:
            values.append(used)
        if total is not None:
            values.append(total)
        _histogram_row(values, self._memory, quantiled)
        disks = sorted(latest.disk.items()) if latest and latest.disk else []
        values += [r for _, (r, _) in disks]
        values += [w for _, (_, w) in disks]
        nics = sorted(latest.network.items()) if latest and latest.network else []
        values += [r for _, (r, _) in nics]
        values += [t for _, (_, t) in nics]
        gpus = self._gpu_row(values, quantiled)
        shape = (
            len(cores),
            len(iowait),
            used is None,
            total is None,
            tuple(d for d, _ in disks),
            tuple(n for n, _ in nics),
            tuple(quantiled),
            gpus,
        )
        return shape, values

    def _gpu_row(self, values: list[float], quantiled: list[bool]) -> tuple:
        """`_gpu_families`' values onto `values`; returns their shape."""
        if not self._gpus:
            return ()
        present = {g.index for g in self.latest.gpus} if self.latest else set()
        states = sorted(self._gpus.items())
        shape: list = []
        for i, s in states:
            latest = s.latest
            shape.append(
                (i, latest.uuid if latest else "", i in present and latest is not None)
                + ((latest.name, latest.driver_version) if latest else ("", ""))
            )
        shown = [s.latest for i, s in states if i in present and s.latest is not None]
        values += [1] * len(shown)  # gpu_info
        for _, attr in _GPU_GAUGES + (("", "energy_joules"),):
            row = [getattr(g, attr) for g in shown]
            shape.append(tuple(v is None for v in row))
            values += [v for v in row if v is not None]
        for _, s in states:
            _histogram_row(values, s.utilization, None)
        for _, s in states:
            _histogram_row(values, s.memory, None)
        _histogram_row(values, self._pooled_utilization, quantiled)
        _histogram_row(values, self._pooled_memory, quantiled)
        distances = []
        for (_, sa), (_, sb) in itertools.combinations(states, 2):
            d = js_distance(sa.load_bins, sb.load_bins)
            if d is not None:
                distances.append(d)
            shape.append(d is not None)
        values += distances
        return tuple(shape)


def _histogram_row(values: list[float], hist: Histogram, quantiled: list[bool] | None) -> None:
    """A histogram's samples (cumulative buckets, +Inf, count, sum) onto `values`; and, when
    `quantiled` is given, those of the summary of its quantiles (`Families.quantiles`)."""
    cumulative = list(itertools.accumulate(hist.counts))
    cumulative[-1] = hist.count  # +Inf is the count (add_histogram)
    values += cumulative
    values.append(hist.count)
    values.append(hist.sum)
    if quantiled is not None:
        if hist.count:
            values += hist.quantiles(contract.USAGE_QUANTILES, cumulative)
        quantiled.append(bool(hist.count))
        values.append(hist.count)
        values.append(hist.sum)


class Families:
    """Builds families from the contract, prefixing the identity labels. Histogram rows hold
    objects with an `add_to(family, label_values)` method."""

    def __init__(self, identity: list[str]):
        self.identity = identity

    def _doc(self, name: str) -> str:
        return contract.metric(name).help

    def gauge(self, name, labels, rows):
        family = GaugeMetricFamily(name, self._doc(name), labels=self.identity + labels)
        for values, v in rows:
            family.add_metric(values, v)
        return family

    def known(self, name: str, ident: list[str], value: float | None) -> Iterator[MetricFamily]:
        """A gauge of one `value` (no labels but the identity's); none while it is unknown.

        >>> fam = Families(["node"])
        >>> list(fam.known(contract.MEMORY_USED_BYTES, ["n1"], None))
        []
        >>> [f.samples[0].value for f in fam.known(contract.MEMORY_USED_BYTES, ["n1"], 2.0)]
        [2.0]
        """
        if value is not None:
            yield self.gauge(name, [], [(ident, value)])

    def counter(self, name, labels, rows):
        base = contract.metric(name).base
        family = CounterMetricFamily(base, self._doc(name), labels=self.identity + labels)
        for values, v in rows:
            family.add_metric(values, v)
        return family

    def histogram(self, name, labels, rows):
        family = HistogramMetricFamily(name, self._doc(name), labels=self.identity + labels)
        for values, hist in rows:
            hist.add_to(family, values)
        return family

    def quantiles(self, name: str, ident: list[str], hist: Histogram) -> SummaryMetricFamily:
        """A node histogram as a summary of its quantiles since the exporter started, served
        so that OverallSystemUsage need not run `histogram_quantile` over a fleet's buckets.
        Without observations there are no quantiles (histogram_quantile would give NaN)."""
        family = SummaryMetricFamily(name, self._doc(name), labels=self.identity)
        labels = dict(zip(self.identity, ident))
        if hist.count:
            family.samples = [
                Sample(name, {**labels, "quantile": f"{q:g}"}, hist.quantile(q))
                for q in contract.USAGE_QUANTILES
            ]
        family.add_metric(ident, hist.count, hist.sum)
        return family


def _count_pairs(counts: dict, busiest: float, idlest: float) -> None:
    for pair in counts:
        if busiest > pair[0] and idlest < pair[1]:
            counts[pair] += 1


def _load_bin(utilization: float) -> int:
    # 2 % bins over [0, 1]; the last bin is closed so a GPU pinned at 100 % is counted.
    return min(
        max(int(utilization * contract.LOAD_BALANCING_BINS), 0), contract.LOAD_BALANCING_BINS - 1
    )


def js_distance(p_counts: Sequence[int], q_counts: Sequence[int]) -> float | None:
    """Jensen-Shannon distance of two histograms (natural log); None if either is empty.

    >>> js_distance([5, 0], [0, 5]) == math.sqrt(math.log(2))
    True
    """
    n_p, n_q = sum(p_counts), sum(q_counts)
    if not n_p or not n_q:
        return None
    divergence = 0.0
    # Bins empty in both add nothing: only the others are visited (found at C speed),
    # in the same order, so the sum is the same to the last bit.
    for i in itertools.compress(itertools.count(), map(operator.or_, p_counts, q_counts)):
        a, b = p_counts[i], q_counts[i]
        p, q = a / n_p, b / n_q
        m = (p + q) / 2
        if p:
            divergence += p * math.log(p / m)
        if q:
            divergence += q * math.log(q / m)
    return math.sqrt(max(divergence / 2, 0.0))


def sample_value(families: Iterable[MetricFamily], name: str, **labels: str) -> float | None:
    """The value of the first sample called `name` whose labels include `labels`."""
    for family in families:
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def samples_of(families: Iterable[MetricFamily]) -> Iterator[tuple[str, dict[str, str], float]]:
    """Flatten families into (sample name, labels, value), as a scrape would show them."""
    for family in families:
        for s in family.samples:
            yield s.name, dict(s.labels), s.value

"""Host samples held compactly while replay works through them.

A SageMaker sample of a 16-core, 8-GPU host is 16 + 16 + 16 numbers; as `HostSample` and
`GpuSample` objects it takes about 6 KB, as arrays of doubles about 0.7 KB. Replay keeps
every sample of a job until it has scraped it, so `CompactSamples` holds them as arrays and
builds each `HostSample` only when the scrape observes it.

    >>> samples = CompactSamples()
    >>> samples.append(HostSample(1.0, cpu_utilization=[0.5], gpus=[GpuSample(0, "gpu0", 0.9)]))
    >>> samples[0].gpus[0].utilization, samples.times[0], len(samples)
    (0.9, 1.0, 1)
"""

from __future__ import annotations

import array
from collections.abc import Iterator, Sequence

from trainprof.sampling import GpuSample, HostSample

_NONE = float("nan")  # a missing value inside an array of doubles


def _pack(values) -> array.array:
    return array.array("d", (_NONE if v is None else v for v in values))


def _unpack(value: float) -> float | None:
    return None if value != value else value


class CompactSamples(Sequence[HostSample]):
    """HostSamples with only timestamp, per-core busy and I/O wait, memory ratio and per-GPU
    utilization and memory ratio (what SageMaker's system metrics hold), as arrays."""

    def __init__(self) -> None:
        self.times = array.array("d")
        self._rows: list[tuple] = []

    def append(self, sample: HostSample) -> None:
        self.times.append(sample.timestamp)
        self._rows.append(
            (
                _pack(sample.cpu_utilization),
                _pack(sample.cpu_iowait),
                sample.memory_used_ratio,
                array.array("i", (g.index for g in sample.gpus)),
                _pack(g.utilization for g in sample.gpus),
                _pack(g.memory_used_ratio for g in sample.gpus),
            )
        )

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        cpu, iowait, memory, indices, util, mem = self._rows[i]
        return HostSample(
            self.times[i],
            cpu_utilization=list(cpu),
            cpu_iowait=list(iowait),
            memory_used_ratio=memory,
            gpus=[
                GpuSample(index, f"gpu{index}", _unpack(u), _unpack(m))
                for index, u, m in zip(indices, util, mem)
            ],
        )

    def __iter__(self) -> Iterator[HostSample]:
        for i in range(len(self)):
            yield self[i]

    def in_time_order(self) -> CompactSamples:
        """These samples sorted by time (themselves when they already are)."""
        times = self.times
        if all(times[i] <= times[i + 1] for i in range(len(times) - 1)):
            return self
        out = CompactSamples()
        for i in sorted(range(len(times)), key=times.__getitem__):
            out.times.append(times[i])
            out._rows.append(self._rows[i])
        return out

    def gpu_indices(self) -> set[int]:
        return {i for row in self._rows for i in row[3]}

    def select(self, first: float, last: float) -> CompactSamples:
        """The samples from `first` to `last` (inclusive)."""
        out = CompactSamples()
        for t, row in zip(self.times, self._rows):
            if first <= t <= last:
                out.times.append(t)
                out._rows.append(row)
        return out

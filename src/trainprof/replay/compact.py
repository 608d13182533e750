"""Host samples held compactly while replay works through them, in memory bounded by a
budget whatever the job's length.

A SageMaker sample of a 16-core, 8-GPU host is 16 + 16 + 16 numbers; as `HostSample` and
`GpuSample` objects it takes about 6 KB, packed as doubles about 0.4 KB. Replay keeps
every sample of a job until it has scraped it, so `CompactSamples` packs each into bytes,
moves them to a temporary file past `BUDGET` (about 11 MB per job-hour of a 2-node,
16-GPU job stayed in memory before), and builds each `HostSample` only when the scrape
reads it. What stays in memory per sample is its time and where its bytes are (16 bytes).

    >>> samples = CompactSamples()
    >>> samples.append(HostSample(1.0, cpu_utilization=[0.5], gpus=[GpuSample(0, "gpu0", 0.9)]))
    >>> samples[0].gpus[0].utilization, samples.times[0], len(samples)
    (0.9, 1.0, 1)
"""

from __future__ import annotations

import array
import struct
import tempfile
from collections.abc import Iterator, Sequence
from typing import IO

from trainprof.contract.sampling import GpuSample, HostSample

_NONE = float("nan")  # a missing value inside an array of doubles
# Packed samples kept in memory before they move to the temporary file.
BUDGET = 4 * 1024 * 1024
_HEADER = struct.Struct("<IIId")  # cores (busy), cores (iowait), GPUs, memory ratio


def _pack(values) -> bytes:
    if not isinstance(values, list) or None in values:
        values = [_NONE if v is None else v for v in values]
    return array.array("d", values).tobytes()


def _unpack(value: float) -> float | None:
    return None if value != value else value


def _doubles(data: bytes, start: int, n: int) -> tuple[array.array, int]:
    out = array.array("d")
    out.frombytes(data[start : start + 8 * n])
    return out, start + 8 * n


class CompactSamples(Sequence[HostSample]):
    """HostSamples with only timestamp, per-core busy and I/O wait, memory ratio and per-GPU
    utilization and memory ratio (what SageMaker's system metrics hold), packed."""

    def __init__(self, budget: int = BUDGET) -> None:
        self.times = array.array("d")
        self._offsets = array.array("q")  # where each sample's bytes start
        self._pending = bytearray()  # bytes not yet in the file
        self._flushed = 0  # bytes in the file
        self._file: IO[bytes] | None = None
        self._budget = budget
        self._gpus: set[int] = set()

    def append(self, sample: HostSample) -> None:
        self.append_values(
            sample.timestamp,
            list(sample.cpu_utilization),
            list(sample.cpu_iowait),
            sample.memory_used_ratio,
            [g.index for g in sample.gpus],
            [g.utilization for g in sample.gpus],
            [g.memory_used_ratio for g in sample.gpus],
        )

    def append_values(
        self,
        timestamp: float,
        cpu: list[float],
        iowait: list[float],
        memory: float | None,
        gpus: list[int],
        utilization: list[float | None],
        memory_used: list[float | None],
    ) -> None:
        """`append` of the sample these fields make (GPU i: gpus[i], named "gpu<index>")
        without building it."""
        self._gpus.update(gpus)
        data = b"".join(
            (
                _HEADER.pack(len(cpu), len(iowait), len(gpus), _NONE if memory is None else memory),
                _pack(cpu),
                _pack(iowait),
                array.array("i", gpus).tobytes(),
                _pack(utilization),
                _pack(memory_used),
            )
        )
        self._append_bytes(timestamp, data)

    def _append_bytes(self, t: float, data: bytes) -> None:
        self.times.append(t)
        self._offsets.append(self._flushed + len(self._pending))
        self._pending += data
        if len(self._pending) > self._budget:
            if self._file is None:
                self._file = tempfile.TemporaryFile(mode="w+b")
            self._file.seek(0, 2)
            self._file.write(self._pending)
            self._flushed += len(self._pending)
            self._pending = bytearray()

    def _bytes(self, i: int) -> bytes:
        start = self._offsets[i]
        end = (
            self._offsets[i + 1]
            if i + 1 < len(self._offsets)
            else self._flushed + len(self._pending)
        )
        if start >= self._flushed:
            return bytes(self._pending[start - self._flushed : end - self._flushed])
        assert self._file is not None  # bytes before `_flushed` are in the file
        self._file.seek(start)
        return self._file.read(end - start)

    def __len__(self) -> int:
        return len(self.times)

    def close(self) -> None:
        """Let the temporary file go (the samples already read stay readable no more)."""
        if getattr(self, "_file", None) is not None:
            self._file.close()  # type: ignore[union-attr]
            self._file = None

    def __del__(self) -> None:
        self.close()

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        data = self._bytes(i)
        cores, waits, gpus, memory = _HEADER.unpack_from(data)
        at = _HEADER.size
        cpu, at = _doubles(data, at, cores)
        iowait, at = _doubles(data, at, waits)
        indices = _indices(data)
        at += 4 * gpus
        util, at = _doubles(data, at, gpus)
        mem, at = _doubles(data, at, gpus)
        return HostSample(
            self.times[i],
            cpu_utilization=list(cpu),
            cpu_iowait=list(iowait),
            memory_used_ratio=_unpack(memory),
            gpus=[
                GpuSample(index, f"gpu{index}", _unpack(u), _unpack(m))
                for index, u, m in zip(indices, util, mem)
            ],
        )

    def __iter__(self) -> Iterator[HostSample]:
        for i in range(len(self)):
            yield self[i]

    def _copy(self, order: Sequence[int]) -> CompactSamples:
        out = CompactSamples(self._budget)
        out._gpus = set(self._gpus)
        for i in order:
            out._append_bytes(self.times[i], self._bytes(i))
        return out

    def in_time_order(self) -> CompactSamples:
        """These samples sorted by time (themselves when they already are)."""
        times = self.times
        if all(times[i] <= times[i + 1] for i in range(len(times) - 1)):
            return self
        return self._copy(sorted(range(len(times)), key=times.__getitem__))

    def gpu_indices(self) -> set[int]:
        return set(self._gpus)

    def select(self, first: float, last: float) -> CompactSamples:
        """The samples from `first` to `last` (inclusive)."""
        kept = [i for i, t in enumerate(self.times) if first <= t <= last]
        if len(kept) == len(self):
            return self
        out = self._copy(kept)
        out._gpus = {g for i in kept for g in _indices(self._bytes(i))}
        return out


def _indices(data: bytes) -> array.array:
    """The GPU indices of one packed sample."""
    cores, waits, gpus, _ = _HEADER.unpack_from(data)
    at = _HEADER.size + 8 * (cores + waits)
    out = array.array("i")
    out.frombytes(data[at : at + 4 * gpus])
    return out

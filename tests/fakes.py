"""Fakes of the outside world for the exporter's tests and benchmarks.

`FakeNvml` stands in for the `pynvml` module: it returns pynvml's own ctypes structures
(`c_nvmlUtilization_t`, `c_nvmlMemory_t`, the GPM request) in NVML's units (percent, bytes, mW,
mJ, degrees C, MHz) and raises pynvml's own exception classes, so the GPU source runs exactly
the code it runs against a driver. Constants and structure types are the real module's; an NVML
function the fake does not implement raises AttributeError, so a new call in the source cannot
go untested.

`ScriptedCpu` replaces the CPU source with a fixed pattern of per-core ratios.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import pynvml

from trainprof.contract.sampling import HostSample

GIB = 2**30
_GPM_NAMES = {getattr(pynvml, n): n for n in dir(pynvml) if n.startswith("NVML_GPM_METRIC_")}


@dataclasses.dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    utilization: Sequence[int] = (50,)  # percent; cycled, one value per read
    memory_used: int = 20 * GIB
    memory_total: int = 80 * GIB
    power_mw: int = 312_500
    energy_mj: int = 7_200_000
    temperature: int = 61
    sm_clock_mhz: int = 1980
    gpm: dict[str, float] | None = None  # e.g. {"NVML_GPM_METRIC_SM_UTIL": 87.5}; None: no GPM
    fail: dict[str, type[pynvml.NVMLError]] = dataclasses.field(default_factory=dict)
    lost: bool = False
    calls: int = 0  # NVML calls about this GPU

    def __post_init__(self) -> None:
        self._utilization = itertools.cycle(self.utilization)


@dataclasses.dataclass(frozen=True)
class FakeHandle:
    index: int


class FakeNvml:
    """The pynvml module, for GPUs that are not there. `calls` counts every NVML call."""

    def __init__(
        self,
        gpus: Sequence[FakeGpu],
        driver: str = "550.54.15",
        init_error: type[pynvml.NVMLError] | None = None,
    ):
        self.gpus = list(gpus)
        self.driver = driver
        self.init_error = init_error
        self.calls = 0
        self.calls_by_name: dict[str, int] = {}
        self.initialized = False
        self.shutdowns = 0
        self._gpm_samples: dict[int, tuple[Any, list]] = {}  # address -> (struct, [gpu, n])
        self._gpm_reads = 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML_", "NVMLError", "c_nvml", "struct_c_nvml")):
            return getattr(pynvml, name)
        raise AttributeError(f"FakeNvml does not implement {name}")

    # --- bookkeeping ---------------------------------------------------------------------

    def _call(self, name: str, handle: FakeHandle | None = None) -> FakeGpu | None:
        self.calls += 1
        self.calls_by_name[name] = self.calls_by_name.get(name, 0) + 1
        if not self.initialized:
            raise pynvml.NVMLError_Uninitialized()
        if handle is None:
            return None
        gpu = self.gpus[handle.index]
        gpu.calls += 1
        if gpu.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if name in gpu.fail:
            raise gpu.fail[name]()
        return gpu

    def count(self, name: str) -> int:
        return self.calls_by_name.get(name, 0)

    # --- library -------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls += 1
        if self.init_error is not None:
            raise self.init_error()
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self.initialized = False
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        if not 0 <= index < len(self.gpus):
            self._call("nvmlDeviceGetHandleByIndex")
            raise pynvml.NVMLError_InvalidArgument()
        self._call("nvmlDeviceGetHandleByIndex", FakeHandle(index))
        return FakeHandle(index)

    # --- device --------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return self._call("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        return self._call("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle):
        gpu = self._call("nvmlDeviceGetUtilizationRates", handle)
        return pynvml.c_nvmlUtilization_t(gpu=next(gpu._utilization), memory=30)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle):
        gpu = self._call("nvmlDeviceGetMemoryInfo", handle)
        return pynvml.c_nvmlMemory_t(
            total=gpu.memory_total, used=gpu.memory_used, free=gpu.memory_total - gpu.memory_used
        )

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._call("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        return self._call("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        gpu = self._call("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.temperature

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock: int) -> int:
        gpu = self._call("nvmlDeviceGetClockInfo", handle)
        if clock != pynvml.NVML_CLOCK_SM:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.sm_clock_mhz

    # --- GPM (Hopper and newer) ----------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: FakeHandle):
        gpu = self._call("nvmlGpmQueryDeviceSupport", handle)
        return pynvml.c_nvmlGpmSupport_t(
            version=pynvml.NVML_GPM_SUPPORT_VERSION, isSupportedDevice=int(gpu.gpm is not None)
        )

    def nvmlGpmSampleAlloc(self):
        self._call("nvmlGpmSampleAlloc")
        struct = pynvml.struct_c_nvmlGpmSample_t()
        sample = pynvml.c_nvmlGpmSample_t(struct)
        self._gpm_samples[_address(sample)] = (struct, [None, None])
        return sample

    def nvmlGpmSampleFree(self, sample) -> None:
        self._call("nvmlGpmSampleFree")
        if self._gpm_samples.pop(_address(sample), None) is None:
            raise pynvml.NVMLError_InvalidArgument()

    def nvmlGpmSampleGet(self, handle: FakeHandle, sample):
        self._call("nvmlGpmSampleGet", handle)
        state = self._gpm_samples.get(_address(sample))
        if state is None:
            raise pynvml.NVMLError_InvalidArgument()
        self._gpm_reads += 1
        state[1][:] = [handle.index, self._gpm_reads]
        return sample

    def nvmlGpmMetricsGet(self, request):
        self._call("nvmlGpmMetricsGet")
        if request.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise pynvml.NVMLError_ArgumentVersionMismatch()
        first = self._gpm_samples.get(_address(request.sample1))
        second = self._gpm_samples.get(_address(request.sample2))
        if (
            first is None
            or second is None
            or first[1][0] != second[1][0]
            or first[1][1] is None
            or not first[1][1] < second[1][1]
        ):
            raise pynvml.NVMLError_InvalidArgument()
        gpu = self.gpus[second[1][0]]
        if gpu.lost:
            raise pynvml.NVMLError_GpuIsLost()
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            value = (gpu.gpm or {}).get(_GPM_NAMES.get(metric.metricId, ""))
            if value is None:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = value
        return request


def _address(sample) -> int:
    return ctypes.cast(sample, ctypes.c_void_p).value


class ScriptedCpu:
    """A CPU source playing `pattern` (one (busy per core, iowait per core) pair per read,
    cycled), from the first read on: the sampler's priming read takes the first step."""

    name = "cpu"

    def __init__(self, pattern: Sequence[tuple[Sequence[float], Sequence[float]]]):
        self._pattern = itertools.cycle(pattern)
        self.reads = 0

    def read(self, sample: HostSample) -> bool:
        busy, iowait = next(self._pattern)
        self.reads += 1
        sample.cpu_utilization = list(busy)
        sample.cpu_iowait = list(iowait)
        return True

    def close(self) -> None:
        pass


class ScriptedHostCounters:
    """Memory, disk and network readings that grow steadily, without psutil: a source that
    reads the (process-wide) procfs would also read other tests' fake /proc."""

    name = "host"

    def __init__(self, memory_used: float = 40 * GIB, memory_total: float = 64 * GIB):
        self.memory_used, self.memory_total = memory_used, memory_total
        self.reads = 0

    def read(self, sample: HostSample) -> bool:
        self.reads += 1
        k = self.reads
        sample.memory_used_bytes = self.memory_used
        sample.memory_total_bytes = self.memory_total
        sample.disk = {"nvme0n1": (k * 1e6, k * 2e5)}
        sample.network = {"eth0": (k * 5e6, k * 1e6)}
        return True

    def close(self) -> None:
        pass


def h100s(n: int, gpm: bool = True, **kwargs: Any) -> list[FakeGpu]:
    """n H100-shaped GPUs with stable UUIDs."""
    metrics = {
        "NVML_GPM_METRIC_SM_UTIL": 87.5,
        "NVML_GPM_METRIC_SM_OCCUPANCY": 40.0,
        "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 55.0,
        "NVML_GPM_METRIC_DRAM_BW_UTIL": 32.5,
    }
    return [
        FakeGpu(
            f"GPU-{i:08x}-1f2e-4d3c-8b7a-{i:012x}", gpm=dict(metrics) if gpm else None, **kwargs
        )
        for i in range(n)
    ]

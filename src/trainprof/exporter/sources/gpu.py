"""Per-GPU readings through NVML (`nvidia-ml-py`, imported as `pynvml`).

The module is injected: production passes the real `pynvml`, tests a fake that returns NVML's
own structures and raises pynvml's own exception classes, so both run this code.

Failures are handled at three levels, as gpustat does:

    field   NotSupported, NoPermission, FunctionNotFound -> that series is absent for that GPU
            from then on (asked once, said once)
    GPU     GpuIsLost, GpuNotFound, ResetRequired -> that GPU's latest-sample series disappear
            until the exporter restarts; any other NVML error (Unknown, Timeout, ...) -> that
            GPU is left out of this sample and retried at the next
    source  no driver (nvmlInit fails) or the device count fails -> no GPU series, collector
            success 0; NVML is tried again every 30 s, since a GPU operator may install the
            driver after the exporter started

A host with no NVIDIA driver at all (no libnvidia-ml, and no NVIDIA kernel module in the proc
filesystem the exporter reads) is not failing: it has nothing to read. The source says so in
`unavailable` (NO_DRIVER), which the exporter serves as
`trainprof_collector_unavailable{collector="gpu", reason="no_nvidia_driver"} 1`, and
`TrainprofCollectorFailing` leaves such a collector out. A host whose kernel module is loaded
but whose libnvidia-ml the exporter cannot load (a container without the NVIDIA runtime)
stays a failure.

The collector reports success 0 for a sample that left out a GPU, and from a GPU's loss on; a
missing field is not a failure (it is what the GPU offers).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from trainprof.contract.sampling import GpuSample, HostSample
from trainprof.exporter.once import Once

log = logging.getLogger("trainprof.exporter")

RETRY_OPEN_SECONDS = 30.0
# `unavailable` of a host without any NVIDIA driver.
NO_DRIVER = "no_nvidia_driver"


def nvidia_kernel_module_loaded() -> bool:
    """Whether the NVIDIA kernel module is loaded on this host: it lists itself under
    driver/nvidia in the proc filesystem the exporter reads (the host's with --path.procfs)."""
    import psutil  # its PROCFS_PATH is the exporter's proc filesystem (set_procfs)

    return os.path.isdir(os.path.join(psutil.PROCFS_PATH, "driver", "nvidia"))


# GPM (Hopper and newer) metric -> GpuSample field; NVML reports them in percent.
_GPM_METRICS = (
    ("sm_active", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor_active", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("dram_active", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)


class _Lost(Exception):
    """The GPU is gone for good (fell off the bus, needs a reset)."""


@dataclasses.dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    name: str
    unsupported: set[str] = dataclasses.field(default_factory=set)
    gpm: _Gpm | None = None


class _Gpm:
    """Two alternating GPM samples of one GPU; metrics compare the last two."""

    def __init__(self, nvml: Any, handle: Any):
        self._nvml, self._handle = nvml, handle
        self._samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        self._taken = 0
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(_GPM_METRICS)
        for i, (_, metric_id) in enumerate(_GPM_METRICS):
            request.metrics[i].metricId = getattr(nvml, metric_id)
        self._request = request
        self._success = nvml.NVML_SUCCESS

    def read(self) -> dict[str, float]:
        nvml = self._nvml
        current = self._samples[self._taken % 2]
        nvml.nvmlGpmSampleGet(self._handle, current)
        self._taken += 1
        if self._taken < 2:
            return {}
        request = self._request
        request.sample1 = self._samples[self._taken % 2]
        request.sample2 = current
        nvml.nvmlGpmMetricsGet(request)
        values = {}
        for i, (field, _) in enumerate(_GPM_METRICS):
            metric = request.metrics[i]
            if metric.nvmlReturn == self._success:
                values[field] = min(max(metric.value / 100, 0.0), 1.0)  # percent -> ratio
        return values

    def close(self) -> None:
        for sample in self._samples:
            try:
                self._nvml.nvmlGpmSampleFree(sample)
            except self._nvml.NVMLError:
                pass


class GpuSource:
    """Utilization, memory, power, energy, temperature and SM clock of every GPU, plus GPM
    activity where the GPU offers it, with static facts in `trainprof_gpu_info`.

        # HELP trainprof_gpu_utilization_ratio Fraction of the latest sample period in which ...
        # TYPE trainprof_gpu_utilization_ratio gauge
        trainprof_gpu_utilization_ratio{gpu="0",node="n1",training_job="golden",uuid="GPU-..."} 0.05
        trainprof_gpu_info{driver_version="550.54.15",gpu="0",name="NVIDIA H100 80GB HBM3",
                           node="n1",training_job="golden",uuid="GPU-..."} 1.0

    Check by hand: `nvidia-smi --query-gpu=index,uuid,utilization.gpu,memory.used,power.draw
    --format=csv`.
    """

    name = "gpu"

    def __init__(
        self,
        nvml: Any,
        clock: Callable[[], float] = time.monotonic,
        kernel_module_loaded: Callable[[], bool] = nvidia_kernel_module_loaded,
    ):
        self._nvml = nvml
        self._clock = clock
        self._kernel_module_loaded = kernel_module_loaded
        # Why there is nothing to read on this host (NO_DRIVER), or None.
        self.unavailable: str | None = None
        # Looked up once: these are read for every field of every GPU twice a second.
        self._absent = (
            nvml.NVMLError_NotSupported,
            nvml.NVMLError_NoPermission,
            nvml.NVMLError_FunctionNotFound,
        )
        self._gone = (
            nvml.NVMLError_GpuIsLost,
            nvml.NVMLError_GpuNotFound,
            nvml.NVMLError_ResetRequired,
        )
        self._temperature_gpu = nvml.NVML_TEMPERATURE_GPU
        self._clock_sm = nvml.NVML_CLOCK_SM
        self._once = Once(log)
        self._devices: list[_Device] | None = None
        self._driver = ""
        self._next_open = 0.0
        self._initialized = False
        self._lost: set[int] = set()

    # --- opening ---------------------------------------------------------------------

    def _open(self) -> bool:
        nvml = self._nvml
        if self._clock() < self._next_open:
            return False
        try:
            if not self._initialized:
                nvml.nvmlInit()
                self._initialized = True
            self._driver = _text(nvml.nvmlSystemGetDriverVersion())
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as e:
            self._next_open = self._clock() + RETRY_OPEN_SECONDS
            no_driver = isinstance(e, nvml.NVMLError_LibraryNotFound) and not (
                self._kernel_module_loaded()
            )
            self.unavailable = NO_DRIVER if no_driver else None
            self._once.start(
                "nvml",
                "GPU collector unavailable: %s (%s); GPU metrics are off, "
                "the other collectors keep working; retrying every %gs",
                "no NVIDIA driver on this node (no libnvidia-ml, no NVIDIA kernel module: "
                "nothing to read, not a failure)"
                if no_driver
                else _why_unavailable(nvml, e),
                e,
                RETRY_OPEN_SECONDS,
                level=logging.INFO if no_driver else logging.WARNING,
            )
            return False
        self.unavailable = None
        devices = []
        for index in range(count):
            try:
                devices.append(self._open_device(index))
            except nvml.NVMLError as e:
                self._once.start(
                    f"gpu{index}", "GPU %d cannot be opened (%s); its series are left out", index, e
                )
        self._devices = devices
        self._once.end("nvml", "NVML is available: %d GPUs, driver %s", count, self._driver)
        if not count:
            log.info("NVML reports no GPUs on this node")
        return True

    def _open_device(self, index: int) -> _Device:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        device = _Device(
            index,
            handle,
            _text(nvml.nvmlDeviceGetUUID(handle)),
            _text(nvml.nvmlDeviceGetName(handle)),
        )
        try:
            if nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice:
                device.gpm = _Gpm(nvml, handle)
        except nvml.NVMLError as e:
            log.debug("GPU %d offers no GPM metrics: %s", index, e)
        return device

    # --- reading ---------------------------------------------------------------------

    def read(self, sample: HostSample) -> bool:
        if self._devices is None and not self._open():
            return False
        assert self._devices is not None
        nvml = self._nvml
        gpus, complete = [], True
        for device in list(self._devices):
            key = f"gpu{device.index}"
            try:
                gpus.append(self._read_device(device))
            except _Lost as e:
                self._devices.remove(device)
                self._lost.add(device.index)
                if device.gpm:
                    device.gpm.close()
                self._once.start(
                    key,
                    "GPU %d (%s) is lost (%s): its latest-sample series are "
                    "dropped until the exporter restarts; the other GPUs keep "
                    "reporting",
                    device.index,
                    device.uuid,
                    e.__cause__,
                    level=logging.ERROR,
                )
                complete = False
            except nvml.NVMLError as e:
                self._once.start(
                    key,
                    "GPU %d (%s) could not be read (%s); left out of the samples until it can",
                    device.index,
                    device.uuid,
                    e,
                )
                complete = False
            else:
                self._once.end(key, "GPU %d (%s) is readable again", device.index, device.uuid)
        sample.gpus = gpus
        return complete and not self._lost

    def _read_device(self, device: _Device) -> GpuSample:
        nvml, h, read = self._nvml, device.handle, self._field
        gpu = GpuSample(device.index, device.uuid, name=device.name, driver_version=self._driver)
        utilization = read(device, "utilization", nvml.nvmlDeviceGetUtilizationRates, h)
        if utilization is not None:
            # NVML reports percent
            gpu.utilization = self._plausible(device, "utilization", utilization.gpu / 100)
        memory = read(device, "memory", nvml.nvmlDeviceGetMemoryInfo, h)
        if memory is not None:
            gpu.memory_used_bytes = float(memory.used)
            gpu.memory_total_bytes = float(memory.total)
        power = read(device, "power", nvml.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            gpu.power_watts = self._plausible(device, "power", power / 1000)  # NVML: mW
        energy = read(device, "energy", nvml.nvmlDeviceGetTotalEnergyConsumption, h)
        if energy is not None:
            gpu.energy_joules = energy / 1000  # NVML reports mJ
        temperature = read(
            device, "temperature", nvml.nvmlDeviceGetTemperature, h, self._temperature_gpu
        )
        if temperature is not None:
            gpu.temperature_celsius = float(temperature)
        clock = read(device, "sm_clock", nvml.nvmlDeviceGetClockInfo, h, self._clock_sm)
        if clock is not None:
            gpu.sm_clock_hertz = clock * 1e6  # NVML reports MHz
        if device.gpm is not None:
            for field, value in (read(device, "gpm", device.gpm.read) or {}).items():
                setattr(gpu, field, value)
        return gpu

    def _plausible(self, device: _Device, field: str, value: float) -> float | None:
        """A utilization clamped to 0..1, a power that is not negative (else None); a
        driver reporting an impossible value is said once per GPU and field."""
        if value != value:  # NaN
            fixed = None
        elif field == "utilization":
            fixed = min(max(value, 0.0), 1.0)
        else:
            fixed = value if value >= 0 else None
        if fixed != value:
            self._once.start(
                f"gpu{device.index}-{field}",
                "GPU %d (%s) reported an impossible %s of %g; %s",
                device.index,
                device.uuid,
                field,
                value,
                "clamped to 0..1" if fixed is not None else "left out",
            )
        return fixed

    def _field(self, device: _Device, field: str, function: Callable[..., Any], *args: Any) -> Any:
        """One NVML reading; None when this GPU does not offer it (asked once, said once)."""
        if field in device.unsupported:
            return None
        try:
            return function(*args)
        except self._absent as e:
            device.unsupported.add(field)
            log.info(
                "GPU %d (%s) does not offer %s (%s); that series is absent for it",
                device.index,
                device.uuid,
                field,
                e,
            )
            return None
        except self._gone as e:
            raise _Lost() from e

    def close(self) -> None:
        for device in self._devices or ():
            if device.gpm:
                device.gpm.close()
        self._devices = None
        if self._initialized:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass
            self._initialized = False


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returns str; older releases returned bytes.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _why_unavailable(nvml: Any, error: Exception) -> str:
    if isinstance(error, (nvml.NVMLError_LibraryNotFound, nvml.NVMLError_DriverNotLoaded)):
        return "no NVIDIA driver on this node"
    if isinstance(error, nvml.NVMLError_NoPermission):
        return "no permission to use the NVIDIA driver"
    return "NVML failed"

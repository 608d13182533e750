"""The NVML source against a fake pynvml with NVML's own shapes and every failure mode."""

from __future__ import annotations

import logging

import pynvml
import pytest
from prometheus_client import CollectorRegistry

from trainprof.contract.sampling import SampleAccumulator
from trainprof.exporter.collector import ExporterCollector, SourceRunner
from trainprof.exporter.sampler import Sampler
from trainprof.exporter.sources import default_sources
from trainprof.exporter.sources.gpu import (
    RETRY_OPEN_SECONDS,
    GpuSource,
    nvidia_kernel_module_loaded,
)

from fakes import FakeGpu, FakeNvml, ScriptedCpu, h100s


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Rig:
    """A GPU source and a scripted CPU through the runner into an accumulator."""

    def __init__(self, nvml: FakeNvml, clock=None, kernel_module_loaded: bool = True):
        self.nvml = nvml
        self.gpu = GpuSource(
            nvml, clock=clock or Clock(), kernel_module_loaded=lambda: kernel_module_loaded
        )
        self.runner = SourceRunner([self.gpu, ScriptedCpu([([0.5], [0.0])])])
        self.acc = SampleAccumulator(0.5, {"node": "n1"})

    def sample(self, n: int = 1):
        for _ in range(n):
            self.acc.observe(self.runner.sample())

    def value(self, metric, **labels):
        for family in self.acc.families():
            for s in family.samples:
                if s.name == metric and labels.items() <= s.labels.items():
                    return s.value
        return None

    def success(self, collector="gpu"):
        return self.runner.health[collector][0]

    def gpus_in(self, name):
        return sorted(
            s.labels["gpu"] for f in self.acc.families() for s in f.samples if s.name == name
        )


def test_registering_the_exporter_does_not_touch_the_driver():
    """An auto-describe registry calls describe(), which lists names without NVML."""
    nvml = FakeNvml(h100s(8))
    sources = default_sources(nvml=nvml)
    sampler = Sampler(SourceRunner(sources), SampleAccumulator(0.5))
    registry = CollectorRegistry(auto_describe=True)
    registry.register(ExporterCollector(sampler.families))
    assert nvml.calls == 0


def test_readings_are_exported_in_base_units():
    rig = Rig(FakeNvml(h100s(1, utilization=[97])))
    rig.sample()
    v = lambda name: rig.value(name, gpu="0")
    assert v("trainprof_gpu_utilization_ratio") == 0.97
    assert v("trainprof_gpu_memory_used_bytes") == 20 * 2**30
    assert v("trainprof_gpu_memory_total_bytes") == 80 * 2**30
    assert v("trainprof_gpu_power_watts") == 312.5
    assert v("trainprof_gpu_energy_joules_total") == 7200.0
    assert v("trainprof_gpu_temperature_celsius") == 61.0
    assert v("trainprof_gpu_sm_clock_hertz") == 1.98e9
    assert (
        rig.value(
            "trainprof_gpu_info",
            gpu="0",
            name="NVIDIA H100 80GB HBM3",
            driver_version="550.54.15",
            uuid="GPU-00000000-1f2e-4d3c-8b7a-000000000000",
        )
        == 1
    )
    assert rig.value("trainprof_gpu_memory_used_sampled_ratio_bucket", gpu="0", le="0.25") == 1
    assert rig.success() == 1.0


def test_without_a_driver_the_gpu_collector_reports_itself_unavailable_once(caplog):
    clock = Clock()
    nvml = FakeNvml(h100s(2), init_error=pynvml.NVMLError_LibraryNotFound)
    rig = Rig(nvml, clock)
    with caplog.at_level(logging.INFO, "trainprof.exporter"):
        rig.sample(5)
    assert rig.success("gpu") == 0.0 and rig.success("cpu") == 1.0
    assert rig.gpus_in("trainprof_gpu_utilization_ratio") == []
    assert rig.value("trainprof_cpu_core_utilization_ratio", cpu="0") == 0.5
    assert rig.value("trainprof_samples_total") == 5
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert (
        "GPU collector unavailable: no NVIDIA driver on this node (NVML Shared Library "
        "Not Found)" in messages[0]
    )
    assert nvml.calls == 1, "NVML is not asked again before the retry interval"


def _served(sampler: Sampler, name: str) -> list[dict[str, str]]:
    return [s.labels for f in sampler.families() for s in f.samples if s.name == name]


@pytest.mark.parametrize(
    "error, kernel_module, unavailable",
    [
        # A laptop or CPU node: nothing NVIDIA at all.
        (pynvml.NVMLError_LibraryNotFound, False, True),
        # The module is loaded but the exporter's container has no libnvidia-ml (no NVIDIA
        # runtime): a failure to fix, not a host without GPUs.
        (pynvml.NVMLError_LibraryNotFound, True, False),
        # libnvidia-ml is there, the module is not loaded: a GPU host whose driver is broken.
        (pynvml.NVMLError_DriverNotLoaded, False, False),
    ],
)
def test_a_host_without_any_nvidia_driver_reports_the_gpu_collector_unavailable(
    error, kernel_module, unavailable, caplog
):
    clock = Clock()
    nvml = FakeNvml(h100s(1), init_error=error)
    gpu = GpuSource(nvml, clock=clock, kernel_module_loaded=lambda: kernel_module)
    sampler = Sampler(SourceRunner([gpu, ScriptedCpu([([0.5], [0.0])])]), SampleAccumulator(0.5))
    with caplog.at_level(logging.INFO, "trainprof.exporter"):
        sampler.sample_once()
    success = {s["collector"]: s for s in _served(sampler, "trainprof_collector_success")}
    assert set(success) == {"gpu", "cpu"}
    served = _served(sampler, "trainprof_collector_unavailable")
    (record,) = caplog.records
    if unavailable:
        assert served == [{"collector": "gpu", "reason": "no_nvidia_driver"}]
        assert record.levelno == logging.INFO
        assert "no NVIDIA kernel module: nothing to read, not a failure" in record.getMessage()
    else:
        assert served == []
        assert record.levelno == logging.WARNING
    # The driver installed later (a GPU operator): the state goes with the first good open.
    nvml.init_error = None
    clock.now += RETRY_OPEN_SECONDS
    sampler.sample_once()
    assert _served(sampler, "trainprof_collector_unavailable") == []


def test_the_kernel_module_is_looked_up_in_the_proc_filesystem_the_exporter_reads(
    tmp_path, monkeypatch
):
    import psutil

    from trainprof.exporter import sources

    monkeypatch.setattr(psutil, "PROCFS_PATH", psutil.PROCFS_PATH)
    (tmp_path / "stat").write_text("cpu  1 0 1 1 0 0 0 0 0 0\n")
    sources.set_procfs(str(tmp_path))
    assert nvidia_kernel_module_loaded() is False
    (tmp_path / "driver" / "nvidia").mkdir(parents=True)
    assert nvidia_kernel_module_loaded() is True


def test_a_driver_that_appears_later_is_picked_up_at_the_next_retry(caplog):
    clock = Clock()
    nvml = FakeNvml(h100s(2), init_error=pynvml.NVMLError_DriverNotLoaded)
    rig = Rig(nvml, clock)
    rig.sample()
    nvml.init_error = None
    clock.now += RETRY_OPEN_SECONDS - 1
    rig.sample()
    assert rig.success() == 0.0
    clock.now += 1
    caplog.clear()
    with caplog.at_level(logging.INFO, "trainprof.exporter"):
        rig.sample()
    assert rig.success() == 1.0
    assert rig.gpus_in("trainprof_gpu_utilization_ratio") == ["0", "1"]
    assert [r.getMessage() for r in caplog.records] == [
        "NVML is available: 2 GPUs, driver 550.54.15"
    ]


def test_no_permission_on_the_driver_is_said_as_such(caplog):
    rig = Rig(FakeNvml(h100s(1), init_error=pynvml.NVMLError_NoPermission))
    with caplog.at_level(logging.INFO, "trainprof.exporter"):
        rig.sample()
    assert "no permission to use the NVIDIA driver" in caplog.records[0].getMessage()


def test_a_failing_device_count_makes_the_collector_unavailable():
    nvml = FakeNvml(h100s(2))
    nvml.nvmlDeviceGetCount = lambda: (_ for _ in ()).throw(pynvml.NVMLError_Unknown())
    rig = Rig(nvml)
    rig.sample()
    assert rig.success() == 0.0 and rig.gpus_in("trainprof_gpu_info") == []


def test_a_gpu_lost_mid_run_drops_its_gauges_and_the_others_keep_reporting(caplog):
    nvml = FakeNvml(h100s(3, utilization=[90]))
    rig = Rig(nvml)
    rig.sample(2)
    nvml.gpus[1].lost = True
    with caplog.at_level(logging.INFO, "trainprof.exporter"):
        rig.sample(4)
    assert rig.gpus_in("trainprof_gpu_utilization_ratio") == ["0", "2"]
    assert rig.gpus_in("trainprof_gpu_info") == ["0", "2"]
    assert rig.gpus_in("trainprof_gpu_power_watts") == ["0", "2"]
    # Its histograms keep the samples it had: a counter must not reset.
    assert rig.value("trainprof_gpu_utilization_sampled_ratio_count", gpu="1") == 2
    assert rig.value("trainprof_gpu_utilization_sampled_ratio_count", gpu="0") == 6
    assert rig.success() == 0.0
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "GPU 1 (GPU-00000001-" in messages[0]
    assert "is lost (GPU is lost)" in messages[0]
    calls = nvml.gpus[1].calls
    rig.sample()
    assert nvml.gpus[1].calls == calls, "the lost GPU is not asked again"


def test_other_device_errors_leave_the_gpu_out_of_that_sample_only(caplog):
    nvml = FakeNvml(h100s(2))
    rig = Rig(nvml)
    rig.sample()
    nvml.gpus[0].fail["nvmlDeviceGetMemoryInfo"] = pynvml.NVMLError_Unknown
    with caplog.at_level(logging.INFO, "trainprof.exporter"):
        rig.sample(3)
        assert rig.gpus_in("trainprof_gpu_utilization_ratio") == ["1"]
        assert rig.success() == 0.0
        del nvml.gpus[0].fail["nvmlDeviceGetMemoryInfo"]
        rig.sample()
    assert rig.gpus_in("trainprof_gpu_utilization_ratio") == ["0", "1"]
    assert rig.success() == 1.0
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["GPU 0", "GPU 0"]
    assert "could not be read (Unknown Error)" in caplog.records[0].getMessage()
    assert "is readable again" in caplog.records[1].getMessage()


@pytest.mark.parametrize(
    "error",
    [
        pynvml.NVMLError_NotSupported,
        pynvml.NVMLError_NoPermission,
        pynvml.NVMLError_FunctionNotFound,
    ],
)
def test_a_field_the_gpu_does_not_offer_is_absent_for_that_gpu_only(error, caplog):
    nvml = FakeNvml(h100s(2))
    nvml.gpus[0].fail["nvmlDeviceGetPowerUsage"] = error
    rig = Rig(nvml)
    with caplog.at_level(logging.INFO, "trainprof.exporter"):
        rig.sample(3)
    assert rig.gpus_in("trainprof_gpu_power_watts") == ["1"]
    assert rig.gpus_in("trainprof_gpu_energy_joules_total") == ["0", "1"]
    assert rig.success() == 1.0, "what a GPU does not offer is not a failure"
    assert nvml.count("nvmlDeviceGetPowerUsage") == 1 + 3, "asked once for GPU 0"
    assert len(caplog.records) == 1 and "does not offer power" in caplog.records[0].getMessage()


def test_utilization_not_supported_leaves_the_histograms_empty_not_zero():
    nvml = FakeNvml(h100s(1))
    nvml.gpus[0].fail["nvmlDeviceGetUtilizationRates"] = pynvml.NVMLError_NotSupported
    rig = Rig(nvml)
    rig.sample(2)
    assert rig.gpus_in("trainprof_gpu_utilization_ratio") == []
    assert rig.value("trainprof_gpu_utilization_sampled_ratio_count", gpu="0") == 0
    assert rig.value("trainprof_gpu_memory_used_sampled_ratio_count", gpu="0") == 2


def test_gpm_metrics_appear_from_the_second_sample_where_offered():
    gpus = h100s(2)
    gpus[1].gpm = None  # an A100: no GPM
    del gpus[0].gpm["NVML_GPM_METRIC_DRAM_BW_UTIL"]  # one metric not offered
    nvml = FakeNvml(gpus)
    rig = Rig(nvml)
    rig.sample()
    assert rig.gpus_in("trainprof_gpu_sm_active_ratio") == []  # GPM compares two samples
    rig.sample()
    assert rig.value("trainprof_gpu_sm_active_ratio", gpu="0") == 0.875
    assert rig.value("trainprof_gpu_sm_occupancy_ratio", gpu="0") == 0.4
    assert rig.value("trainprof_gpu_tensor_active_ratio", gpu="0") == 0.55
    assert rig.gpus_in("trainprof_gpu_dram_active_ratio") == []
    assert rig.gpus_in("trainprof_gpu_sm_active_ratio") == ["0"]
    assert rig.success() == 1.0


def test_a_driver_without_gpm_functions_still_reports_everything_else():
    nvml = FakeNvml(h100s(1))
    nvml.gpus[0].fail["nvmlGpmQueryDeviceSupport"] = pynvml.NVMLError_FunctionNotFound
    rig = Rig(nvml)
    rig.sample(2)
    assert rig.gpus_in("trainprof_gpu_sm_active_ratio") == []
    assert rig.value("trainprof_gpu_utilization_ratio", gpu="0") == 0.5


def test_closing_frees_gpm_samples_and_shuts_nvml_down():
    nvml = FakeNvml(h100s(2))
    rig = Rig(nvml)
    rig.sample(2)
    nvml.gpus[1].lost = True
    rig.sample()
    rig.runner.close()
    assert nvml._gpm_samples == {} and nvml.shutdowns == 1


def test_hostile_gpu_names_are_exported_safely(promtool):
    import subprocess

    from prometheus_client.parser import text_string_to_metric_families

    from trainprof.exporter.exposition import Renderer

    name = 'A100 "SXM"}\n{evil="1"} \\'
    rig = Rig(FakeNvml([FakeGpu("GPU-x", name=name)]))
    rig.sample()
    text = Renderer().render(rig.acc.families(), openmetrics=False)
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
    assert check.returncode == 0, check.stderr.decode()
    parsed = [
        s
        for f in text_string_to_metric_families(text.decode())
        for s in f.samples
        if s.name == "trainprof_gpu_info"
    ]
    assert [s.labels["name"] for s in parsed] == [name]

"""Sources that stop answering or answer nonsense: a hung NVML call, a garbled /proc/stat,
a GPU above 100 % or at negative power. Each must show as a failed collector (or a clamped
value), never as a silent success, and never freeze the other sources or `stop()`."""

from __future__ import annotations

import threading
import time

import psutil

import trainprof.exporter
from trainprof.contract.sampling import HostSample, sample_value
from trainprof.exporter.collector import SourceRunner
from trainprof.exporter.sources import set_procfs
from trainprof.exporter.sources.cpu import CpuSource
from trainprof.exporter.sources.gpu import GpuSource

from fakes import FakeNvml, ScriptedCpu, h100s
from procfs import Procfs


class HangingNvml(FakeNvml):
    """NVML whose utilization call blocks (a driver stuck on a lost GPU) once `hang` is set."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.hang = threading.Event()
        self.release = threading.Event()

    def nvmlDeviceGetUtilizationRates(self, handle):
        if self.hang.is_set():
            self.release.wait(60)
        return super().nvmlDeviceGetUtilizationRates(handle)


def test_a_hung_nvml_call_fails_the_gpu_collector_and_cpu_sampling_goes_on():
    nvml = HangingNvml(h100s(1))
    cpu = ScriptedCpu([([0.9, 0.1], [0.0, 0.0])])
    exporter = trainprof.exporter.start(
        None, sources=[GpuSource(nvml), cpu], identity={"node": "n1"}, datapoint_interval=0.05
    )
    try:
        deadline = time.monotonic() + 10
        while sample_value(exporter.families(), "trainprof_samples_total") in (None, 0.0):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert _success(exporter, "gpu") == 1.0
        nvml.hang.set()
        reads = cpu.reads
        time.sleep(trainprof.exporter.SOURCE_TIMEOUT + 1.5)
        assert cpu.reads - reads >= 10, "CPU sampling froze with the GPU source"
        assert _success(exporter, "gpu") == 0.0, "a hung source still reported success"
        assert _success(exporter, "cpu") == 1.0
        started = time.monotonic()
    finally:
        exporter.stop()
    assert time.monotonic() - started < 3, "stop() waited for the hung NVML call"
    nvml.release.set()


def _success(exporter, collector: str) -> float | None:
    return sample_value(exporter.families(), "trainprof_collector_success", collector=collector)


def test_a_source_that_answers_after_its_timeout_does_not_write_into_a_later_sample():
    class Late:
        name = "cpu"

        def __init__(self):
            self.go = threading.Event()

        def read(self, sample):
            self.go.wait(5)
            sample.cpu_utilization = [0.5]
            return True

        def close(self):
            pass

    late = Late()
    runner = SourceRunner([late], timeout=0.2)
    first = runner.sample()
    assert runner.health["cpu"][0] == 0.0 and not first.cpu_utilization
    late.go.set()
    time.sleep(0.2)
    assert not first.cpu_utilization
    assert runner.sample().cpu_utilization == [0.5]
    assert runner.health["cpu"][0] == 1.0
    runner.close()


def test_a_garbled_proc_stat_is_a_failed_collector_not_an_empty_success(tmp_path, monkeypatch):
    monkeypatch.setattr(psutil, "PROCFS_PATH", psutil.PROCFS_PATH)
    fake = Procfs(tmp_path / "proc")
    fake.write()
    set_procfs(str(fake.root))
    (fake.root / "stat").write_text("garbage that is not /proc/stat\n")
    runner = SourceRunner([CpuSource()])
    runner.sample()
    assert runner.health["cpu"][0] == 0.0


def test_gpu_utilization_above_100_percent_is_clamped_and_negative_power_left_out():
    gpus = h100s(1, gpm=False, utilization=(250,), power_mw=-40_000)
    source = GpuSource(FakeNvml(gpus))
    sample = HostSample(0.0)
    source.read(sample)
    [gpu] = sample.gpus
    assert gpu.utilization == 1.0
    assert gpu.power_watts is None


def test_a_stalled_sampler_reports_every_collector_as_failed():
    from trainprof.contract.sampling import SampleAccumulator
    from trainprof.exporter.sampler import Sampler

    now = [100.0]
    cpu = ScriptedCpu([([0.5], [0.0])])
    sampler = Sampler(
        SourceRunner([cpu]),
        SampleAccumulator(0.5, {"node": "n1"}),
        clock=lambda: now[0],
    )
    sampler._last_sample = now[0]
    sampler.sample_once()
    assert sample_value(sampler.families(), "trainprof_collector_success", collector="cpu") == 1
    now[0] += sampler.stall_after + 1  # no sample finished since: the thread is stuck
    assert sample_value(sampler.families(), "trainprof_collector_success", collector="cpu") == 0
    sampler.sample_once()
    assert sample_value(sampler.families(), "trainprof_collector_success", collector="cpu") == 1

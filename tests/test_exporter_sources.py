"""The psutil sources, read through real psutil from a fake proc filesystem, and the runner
that turns a failing source into collector_success 0 without hiding the others."""

from __future__ import annotations

import logging

import psutil
import pytest

from trainprof.contract.sampling import HostSample, SampleAccumulator
from trainprof.exporter.collector import SourceRunner
from trainprof.exporter.sources import DISK_EXCLUDE, default_sources, set_procfs
from trainprof.exporter.sources.cpu import CpuSource
from trainprof.exporter.sources.disk import DiskSource
from trainprof.exporter.sources.memory import MemorySource
from trainprof.exporter.sources.network import NetworkSource

from procfs import Procfs


@pytest.fixture
def proc(tmp_path, monkeypatch):
    """A fake /proc that psutil reads (restored after the test)."""
    monkeypatch.setattr(psutil, "PROCFS_PATH", psutil.PROCFS_PATH)
    fake = Procfs(tmp_path / "proc")
    fake.write()
    set_procfs(str(fake.root))
    return fake


def read(source) -> HostSample:
    sample = HostSample(0.0)
    assert source.read(sample) is True
    return sample


def test_cpu_ratios_come_from_the_change_between_two_samples(proc):
    cpu = CpuSource()
    assert not read(cpu).cpu_utilization  # the first sample has nothing to compare with
    proc.cpus = [
        {"user": 150, "idle": 940, "iowait": 10},  # +50 user, +40 idle, +10 iowait
        {"user": 100, "system": 25, "idle": 975, "steal": 0},
    ]
    proc.write()
    sample = read(cpu)
    assert sample.cpu_utilization == pytest.approx([0.5, 0.25])
    assert sample.cpu_iowait == pytest.approx([0.1, 0.0])


def test_the_busiest_core_is_served_once_per_host(proc):
    """The bottleneck rules read one busiest-core series per node, not every core's gauge."""
    cpu = CpuSource()
    proc.cpus = [{"user": 100, "idle": 900}] * 3
    proc.write()
    read(cpu)
    proc.cpus = [
        {"user": 130, "idle": 930, "iowait": 40},  # busy 0.3, iowait 0.4
        {"user": 190, "idle": 905, "iowait": 5},  # busy 0.9, iowait 0.05
        {"user": 100, "idle": 1100},  # idle
    ]
    proc.write()
    acc = SampleAccumulator(0.5, {"node": "n1"})
    acc.observe(read(cpu))
    served = {s.name: (s.labels, s.value) for family in acc.families() for s in family.samples}
    assert served["trainprof_cpu_busiest_core_utilization_ratio"] == (
        {"node": "n1"},
        pytest.approx(0.9),
    )
    assert served["trainprof_cpu_busiest_core_iowait_ratio"] == ({"node": "n1"}, pytest.approx(0.4))


def test_cpu_guest_time_is_not_counted_twice(proc):
    cpu = CpuSource()
    read(cpu)
    # The kernel counts guest time inside user already: 60 jiffies of guest are not extra.
    proc.cpus = [{"user": 160, "idle": 940, "guest": 60}, {"user": 100, "idle": 1000}]
    proc.write()
    assert read(cpu).cpu_utilization == pytest.approx([0.6, 0.0])


def test_cpu_counters_that_stand_still_or_go_back_read_as_idle(proc):
    cpu = CpuSource()
    read(cpu)
    proc.cpus = [{"user": 100, "idle": 900}, {"user": 50, "idle": 800}]
    proc.write()
    sample = read(cpu)
    assert sample.cpu_utilization == [0.0, 0.0] and sample.cpu_iowait == [0.0, 0.0]


def test_cpu_a_core_coming_online_restarts_the_comparison(proc):
    cpu = CpuSource()
    read(cpu)
    proc.cpus = [{"user": 200, "idle": 900}] * 3
    proc.write()
    assert not read(cpu).cpu_utilization
    proc.cpus = [{"user": 300, "idle": 900}] * 3
    proc.write()
    assert read(cpu).cpu_utilization == [1.0, 1.0, 1.0]


def test_memory_used_is_total_minus_available(proc):
    sample = read(MemorySource())
    assert sample.memory_total_bytes == 16 * 2**30
    assert sample.memory_used_bytes == 4 * 2**30
    assert sample.memory_ratio() == 0.25


def test_disks_are_whole_devices_in_bytes_without_loop_ram_or_partitions(proc):
    proc.disks = {
        "nvme0n1": (8, 16),
        "nvme0n1p1": (8, 16),
        "sda": (2, 4),
        "sda1": (2, 4),
        "loop0": (1, 1),
        "ram0": (1, 1),
        "dm-0": (4, 4),
    }
    proc.write()
    assert read(DiskSource()).disk == {
        "nvme0n1": (4096.0, 8192.0),
        "sda": (1024.0, 2048.0),
        "dm-0": (2048.0, 2048.0),
    }


def test_network_leaves_out_loopback(proc):
    assert read(NetworkSource()).network == {"eth0": (1_048_576.0, 524_288.0)}


def test_exclude_patterns_are_configurable(proc):
    import re

    proc.nics = {"lo": (1, 1), "eth0": (2, 2), "veth123": (3, 3)}
    proc.write()
    assert set(read(NetworkSource(re.compile(r"^(lo|veth.*)$"))).network) == {"eth0"}
    assert re.match(DISK_EXCLUDE, "mmcblk0p2") and not re.match(DISK_EXCLUDE, "mmcblk0")


def test_procfs_must_look_like_a_proc_filesystem(tmp_path, monkeypatch):
    monkeypatch.setattr(psutil, "PROCFS_PATH", psutil.PROCFS_PATH)
    with pytest.raises(ValueError, match="has no stat file"):
        set_procfs(str(tmp_path))


def test_a_broken_source_is_reported_and_the_others_still_read(proc, caplog):
    runner = SourceRunner(default_sources(["cpu", "memory", "disk", "network"]))
    runner.sample()
    (proc.root / "diskstats").write_text("8 0 sda 1 2\n")  # a line psutil cannot parse
    (proc.root / "meminfo").unlink()
    with caplog.at_level(logging.INFO, "trainprof.exporter"):
        for _ in range(3):
            sample = runner.sample()
    assert {k: ok for k, (ok, _) in runner.health.items()} == {
        "cpu": 1.0,
        "memory": 0.0,
        "disk": 0.0,
        "network": 1.0,
    }
    assert sample.disk == {} and sample.memory_used_bytes is None
    assert len(sample.cpu_utilization) == 2 and "eth0" in sample.network
    failures = [r.getMessage() for r in caplog.records]
    assert len(failures) == 2, "each failure is said once, not every sample"
    assert any("collector memory failed: FileNotFoundError" in m for m in failures)
    assert any("collector disk failed: ValueError" in m for m in failures)

    proc.write()
    caplog.clear()
    with caplog.at_level(logging.INFO, "trainprof.exporter"):
        runner.sample()
    assert runner.health["memory"][0] == runner.health["disk"][0] == 1.0
    assert sorted(r.getMessage() for r in caplog.records) == [
        "collector disk works again",
        "collector memory works again",
    ]


def test_an_unreadable_proc_stat_fails_only_the_cpu_collector(proc):
    runner = SourceRunner(default_sources(["cpu", "memory"]))
    (proc.root / "stat").unlink()
    sample = runner.sample()
    assert runner.health["cpu"][0] == 0.0 and runner.health["memory"][0] == 1.0
    assert not sample.cpu_utilization and sample.memory_used_bytes is not None


def test_the_runner_times_each_source_with_its_clock():
    ticks = iter([10.0, 10.25, 20.0, 19.0])  # the second source sees time go backwards

    class Quiet:
        def __init__(self, name):
            self.name = name

        def read(self, sample):
            return True

        def close(self):
            pass

    runner = SourceRunner([Quiet("a"), Quiet("b")], clock=lambda: next(ticks))
    runner.sample()
    assert runner.health == {"a": (1.0, 0.25), "b": (1.0, 0.0)}


def test_two_sources_may_not_share_a_collector_name():
    with pytest.raises(ValueError, match="share a collector name"):
        SourceRunner([CpuSource(), CpuSource()])


def test_unknown_collectors_are_named():
    with pytest.raises(ValueError, match="unknown collector fpga; expected one of cpu"):
        default_sources(["cpu", "fpga"])

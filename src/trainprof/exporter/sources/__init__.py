"""Where the exporter's readings come from: one module per source.

A source fills its part of a `HostSample` and says whether it read everything:

    class Source(Protocol):
        name: str                              # the `collector` label: cpu, memory, ...
        def read(self, sample: HostSample) -> bool: ...
        def close(self) -> None: ...

`read` returns False when it read only part of what it serves (one GPU of eight is lost) and
raises when it read nothing; either way `trainprof_collector_success{collector=name}` is 0 for
that sample and the other sources are unaffected. A source assigns its fields at the end of
`read`, so a failure never leaves half a reading in the sample.

The psutil sources read `psutil.PROCFS_PATH` (set it with `set_procfs`); the GPU source talks to
the `pynvml` module it is given, so tests hand it a fake with NVML's own shapes and errors; or,
on a node that runs NVIDIA dcgm-exporter, that exporter's `/metrics` (dcgm_exporter.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any, Protocol

from trainprof.contract.sampling import HostSample

COLLECTORS = ("cpu", "memory", "disk", "network", "gpu")

# node_exporter's diskstats default plus eMMC partitions: RAM disks, loop devices, floppies
# and partitions, whose bytes their whole disk already counts.
DISK_EXCLUDE = r"^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p|mmcblk\d+p)\d+$"
NETWORK_EXCLUDE = r"^lo$"


class Source(Protocol):
    name: str

    def read(self, sample: HostSample) -> bool: ...

    def close(self) -> None: ...


def set_procfs(path: str) -> None:
    """Point every psutil source at another proc filesystem (a DaemonSet's /host/proc).

    psutil keeps this process-wide, so it applies to every source in this process. Raises
    ValueError when `path` does not look like a proc filesystem.
    """
    import psutil

    if not os.path.isfile(os.path.join(path, "stat")):
        raise ValueError(f"{path} has no stat file; is it a proc filesystem?")
    psutil.PROCFS_PATH = path


def default_sources(
    enabled: Iterable[str] = COLLECTORS,
    nvml: Any = None,
    disk_exclude: str = DISK_EXCLUDE,
    network_exclude: str = NETWORK_EXCLUDE,
    dcgm_exporter: str | None = None,
    dcgm_poll_interval: float = 1.0,
) -> list[Source]:
    """The sources of the enabled collectors, GPU first.

    The GPU is read first so a sample's GPU utilization and CPU ratios end as close together
    as possible: the bottleneck counters pair them. `nvml` is the pynvml module (imported
    here when None); nothing talks to the driver before the first `read`. With
    `dcgm_exporter` (a URL) the GPU readings come from that dcgm-exporter instead of NVML.
    """
    enabled = set(enabled)
    unknown = enabled - set(COLLECTORS)
    if unknown:
        raise ValueError(
            f"unknown collector {', '.join(sorted(unknown))}; expected one of "
            f"{', '.join(COLLECTORS)}"
        )
    sources: list[Source] = []
    if "gpu" in enabled and dcgm_exporter is not None:
        from trainprof.exporter.sources.dcgm_exporter import DcgmExporterSource

        sources.append(DcgmExporterSource(dcgm_exporter, poll_interval=dcgm_poll_interval))
    elif "gpu" in enabled:
        from trainprof.exporter.sources.gpu import GpuSource

        if nvml is None:
            import pynvml

            nvml = pynvml
        sources.append(GpuSource(nvml))
    if "cpu" in enabled:
        from trainprof.exporter.sources.cpu import CpuSource

        sources.append(CpuSource())
    if "memory" in enabled:
        from trainprof.exporter.sources.memory import MemorySource

        sources.append(MemorySource())
    if "disk" in enabled:
        from trainprof.exporter.sources.disk import DiskSource

        sources.append(DiskSource(re.compile(disk_exclude)))
    if "network" in enabled:
        from trainprof.exporter.sources.network import NetworkSource

        sources.append(NetworkSource(re.compile(network_exclude)))
    return sources

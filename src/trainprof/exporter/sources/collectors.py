"""The sources of the enabled collectors, by name (`default_sources`), and the proc
filesystem the psutil sources read (`set_procfs`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from trainprof.exporter.sources.base import DISK_EXCLUDE, NETWORK_EXCLUDE, Source

COLLECTORS = ("cpu", "memory", "disk", "network", "gpu")


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

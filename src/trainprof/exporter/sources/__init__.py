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

from trainprof.exporter.sources.base import DISK_EXCLUDE, NETWORK_EXCLUDE, Source
from trainprof.exporter.sources.collectors import COLLECTORS, default_sources, set_procfs

__all__ = [
    "COLLECTORS",
    "DISK_EXCLUDE",
    "NETWORK_EXCLUDE",
    "Source",
    "default_sources",
    "set_procfs",
]

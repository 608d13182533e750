"""What every source shares: the `Source` protocol (see the package's docstring) and the
node_exporter-style defaults of the disk and network sources' exclusions."""

from __future__ import annotations

from typing import Protocol

from trainprof.contract.sampling import HostSample

# node_exporter's diskstats default plus eMMC partitions: RAM disks, loop devices, floppies
# and partitions, whose bytes their whole disk already counts.
DISK_EXCLUDE = r"^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p|mmcblk\d+p)\d+$"
NETWORK_EXCLUDE = r"^lo$"


class Source(Protocol):
    name: str

    def read(self, sample: HostSample) -> bool: ...

    def close(self) -> None: ...

"""Bytes read and written per block device from /proc/diskstats (psutil)."""

from __future__ import annotations

import re

import psutil

from trainprof.contract.sampling import HostSample
from trainprof.exporter.sources.base import DISK_EXCLUDE


class DiskSource:
    """Cumulative bytes read and written by each whole disk (`exclude` drops loop and RAM
    devices and partitions by default, so summing devices counts every byte once).

        # HELP trainprof_disk_read_bytes_total Bytes read from a whole block device ...
        # TYPE trainprof_disk_read_bytes_total counter
        trainprof_disk_read_bytes_total{device="nvme0n1",node="n1",training_job="golden"} 524288.0

    Check by hand: `cat /proc/diskstats` (sectors read x 512, the sixth column).
    """

    name = "disk"

    def __init__(self, exclude: re.Pattern[str] = re.compile(DISK_EXCLUDE)):
        self._exclude = exclude

    def read(self, sample: HostSample) -> bool:
        # nowrap=False: the kernel's counters are 64-bit, and psutil's wrap correction keeps
        # process-wide state that would turn a replaced device's reset into a jump.
        counters = psutil.disk_io_counters(perdisk=True, nowrap=False) or {}
        sample.disk = {
            name: (float(c.read_bytes), float(c.write_bytes))
            for name, c in counters.items()
            if not self._exclude.match(name)
        }
        return True

    def close(self) -> None:
        pass

"""Host memory from /proc/meminfo (psutil)."""

from __future__ import annotations

import psutil

from trainprof.contract.sampling import HostSample


class MemorySource:
    """Memory installed and in use, where in use is total minus available (what the kernel
    could hand out without swapping), not total minus free.

        # HELP trainprof_memory_used_bytes Host memory in use (total minus available) ...
        # TYPE trainprof_memory_used_bytes gauge
        trainprof_memory_used_bytes{node="n1",training_job="golden"} 4.294967296e+09

    Check by hand: `free -b` (total minus available).
    """

    name = "memory"

    def read(self, sample: HostSample) -> bool:
        memory = psutil.virtual_memory()
        sample.memory_total_bytes = float(memory.total)
        sample.memory_used_bytes = float(memory.total - memory.available)
        return True

    def close(self) -> None:
        pass

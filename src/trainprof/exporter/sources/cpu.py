"""Per-core utilization and I/O wait from successive /proc/stat readings (psutil)."""

from __future__ import annotations

import psutil

from trainprof.contract.sampling import HostSample


class CpuSource:
    """Busy and I/O-wait fraction of every logical core since the previous sample.

    Busy is psutil's (and so SageMaker's) definition: everything but idle and iowait, guest
    time already being inside user and nice. The first sample has no previous one and reports
    no cores; so does the first sample after a core comes or goes.

        # HELP trainprof_cpu_core_utilization_ratio Busy fraction of one logical core ...
        # TYPE trainprof_cpu_core_utilization_ratio gauge
        trainprof_cpu_core_utilization_ratio{cpu="0",node="n1",training_job="golden"} 0.95
        trainprof_cpu_core_iowait_ratio{cpu="1",node="n1",training_job="golden"} 0.6

    Check by hand: `mpstat -P ALL 1` (100 - %idle - %iowait, and %iowait).
    """

    name = "cpu"

    def __init__(self) -> None:
        self._previous: list | None = None

    def read(self, sample: HostSample) -> bool:
        times = psutil.cpu_times(percpu=True)
        if not times:
            raise ValueError(f"no per-core lines (cpuN) in {psutil.PROCFS_PATH}/stat")
        previous, self._previous = self._previous, times
        if previous is None or len(previous) != len(times):
            return True
        busy, iowait = [], []
        for before, now in zip(previous, times):
            total = _total(now) - _total(before)
            if total <= 0:  # an offline core, or counters that went backwards
                busy.append(0.0)
                iowait.append(0.0)
                continue
            idle = now.idle - before.idle
            waiting = getattr(now, "iowait", 0.0) - getattr(before, "iowait", 0.0)
            busy.append(_ratio(1.0 - (idle + waiting) / total))
            iowait.append(_ratio(waiting / total))
        sample.cpu_utilization = busy
        sample.cpu_iowait = iowait
        return True

    def close(self) -> None:
        pass


def _total(times) -> float:
    # Linux counts guest time inside user and nice already.
    return sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


def _ratio(value: float) -> float:
    return min(max(value, 0.0), 1.0)

"""A fake proc filesystem for the psutil sources: the files psutil reads, in the kernel's format.

The psutil sources are tested through real psutil pointed at this tree with `--path.procfs`
(psutil.PROCFS_PATH), the way client_python tests its process collector on captured files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

CPU_FIELDS = (
    "user",
    "nice",
    "system",
    "idle",
    "iowait",
    "irq",
    "softirq",
    "steal",
    "guest",
    "guest_nice",
)


@dataclasses.dataclass
class Procfs:
    root: Path
    # per core: jiffies per field of CPU_FIELDS (missing fields are 0)
    cpus: Sequence[Mapping[str, int]] = ({"user": 100, "idle": 900}, {"user": 100, "idle": 900})
    mem_total_kib: int = 16 * 1024 * 1024
    mem_available_kib: int = 12 * 1024 * 1024
    # device -> (sectors read, sectors written)
    disks: Mapping[str, tuple[int, int]] = dataclasses.field(
        default_factory=lambda: {"nvme0n1": (1024, 2048)}
    )
    # interface -> (bytes received, bytes sent)
    nics: Mapping[str, tuple[int, int]] = dataclasses.field(
        default_factory=lambda: {"lo": (999, 999), "eth0": (1_048_576, 524_288)}
    )

    def write(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "net").mkdir(exist_ok=True)
        total = [sum(c.get(f, 0) for c in self.cpus) for f in CPU_FIELDS]
        lines = ["cpu  " + " ".join(map(str, total))]
        for i, core in enumerate(self.cpus):
            lines.append(f"cpu{i} " + " ".join(str(core.get(f, 0)) for f in CPU_FIELDS))
        lines += [
            "intr 0",
            "ctxt 0",
            "btime 1700000000",
            "processes 1",
            "procs_running 1",
            "procs_blocked 0",
        ]
        (self.root / "stat").write_text("\n".join(lines) + "\n")

        free = self.mem_available_kib // 2
        meminfo = {
            "MemTotal": self.mem_total_kib,
            "MemFree": free,
            "MemAvailable": self.mem_available_kib,
            "Buffers": 1024,
            "Cached": 2048,
            "SwapCached": 0,
            "Active": 4096,
            "Inactive": 2048,
            "Shmem": 512,
            "Slab": 1024,
            "SReclaimable": 512,
            "SwapTotal": 0,
            "SwapFree": 0,
        }
        (self.root / "meminfo").write_text(
            "".join(f"{k + ':':<16}{v:>8} kB\n" for k, v in meminfo.items())
        )

        rows = []
        for minor, (name, (read, written)) in enumerate(self.disks.items()):
            stats = [10, 0, read, 5, 20, 0, written, 7, 0, 12, 12, 0, 0, 0, 0]
            rows.append(f"   8 {minor:7d} {name} " + " ".join(map(str, stats)))
        (self.root / "diskstats").write_text("\n".join(rows) + "\n")

        head = (
            "Inter-|   Receive                                                |  Transmit\n"
            " face |bytes    packets errs drop fifo frame compressed multicast|bytes    "
            "packets errs drop fifo colls carrier compressed\n"
        )
        body = "".join(
            f"{name:>6}: {rx} 10 0 0 0 0 0 0 {tx} 10 0 0 0 0 0 0\n"
            for name, (rx, tx) in self.nics.items()
        )
        (self.root / "net" / "dev").write_text(head + body)
        return self.root

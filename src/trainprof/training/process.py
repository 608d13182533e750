"""Facts about this process that the training series need: when it started, which GPUs it uses.

Standard library only (a training container need not have psutil), and nothing here
initialises CUDA: a CUDA context created before DataLoader workers fork breaks them.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import Any

# Fallback when /proc cannot tell: this module is imported with trainprof, early in most scripts.
_IMPORTED_AT = time.time()


def process_start_time(proc: str = "/proc") -> float:
    """Unix time this process was created, from /proc (Linux); else when trainprof was imported.

    MaxInitializationTime measures from here, so the time a script spends importing
    frameworks and loading data before `trainprof.start()` counts as initialisation.
    """
    try:
        with open(os.path.join(proc, "self", "stat"), encoding="ascii") as f:
            stat = f.read()
        # Field 22, starttime, in clock ticks after boot. The command name (field 2) may
        # contain spaces and parentheses, so count fields after its closing parenthesis.
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        with open(os.path.join(proc, "stat"), encoding="ascii") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED_AT


def detect_gpus(torch: Any = None, env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """(gpu, uuid) of the CUDA device this thread uses, if PyTorch has already set CUDA up.

    `gpu` is the index NVML and dcgm-exporter use when CUDA_VISIBLE_DEVICES lists indices,
    else PyTorch's own index; `uuid` ("GPU-...") is the reliable key to join node-level GPU
    metrics on. Returns [] without torch, without CUDA, or before CUDA is initialised (this
    never initialises it). `torch` and `env` are injectable for tests.
    """
    if torch is None:
        torch = sys.modules.get("torch")
    if torch is None:
        return []
    env = os.environ if env is None else env
    cuda = torch.cuda
    if not cuda.is_available() or not cuda.is_initialized():
        return []
    index = cuda.current_device()
    uuid = str(getattr(cuda.get_device_properties(index), "uuid", "") or "")
    if uuid and not uuid.startswith(("GPU-", "MIG-")):
        uuid = "GPU-" + uuid
    visible = [v.strip() for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    gpu = str(index)
    if index < len(visible) and visible[index].isdigit():
        gpu = visible[index]
    return [(gpu, uuid)]


def framework_info() -> tuple[str, str]:
    """("pytorch", version) once torch is imported; ("", "") before."""
    torch = sys.modules.get("torch")
    version = getattr(torch, "__version__", None)
    return ("pytorch", str(version)) if version else ("", "")

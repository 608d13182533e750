"""Kernel profile windows in the training process: `trainprof.start(kernel_profile=...)`.

    trainprof.start(kernel_profile=True)                      # 20 steps every 10 minutes
    trainprof.start(kernel_profile="steps=50,every=30m,keep=4,dir=/scratch/traces")
    TRAINPROF_KERNEL_PROFILE=on python train.py               # the same from the environment

Off by default. After `first` steps (warm-up), and then `every` seconds after the previous
window ended, `torch.profiler` records `steps` steps (one `ProfilerStep#N` per step). The
training thread only starts and stops the profiler at step boundaries; a background thread
writes the window's trace (gzip, newest `keep` kept, path logged) and folds it into the
`trainprof_kernel_*` series (`trainprof.trace.series`). Outside windows a step pays one
attribute check and, between windows, one clock read.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import re
import tempfile
import threading
import time
from pathlib import Path
from time import perf_counter
from typing import Any

from trainprof.contract.durations import parse_duration
from trainprof.trace.series import KernelSeries

log = logging.getLogger("trainprof")
ENV = "TRAINPROF_KERNEL_PROFILE"
_ON = {"1", "on", "true", "yes"}
_OFF = {"", "0", "off", "false", "no"}


@dataclasses.dataclass(frozen=True)
class KernelProfile:
    steps: int = 20  # steps per window
    every: float = 600.0  # seconds from the end of one window to the start of the next
    first: int = 10  # steps before the first window (compilation, cudnn autotuning)
    keep: int = 10  # traces kept on disk, newest first
    top: int = 10  # kernels and CPU operators labelled per window; the rest are "other"
    dir: str | None = None  # default: <tmp>/trainprof-traces

    @classmethod
    def parse(cls, value: Any) -> KernelProfile | None:
        """None (off) or a KernelProfile from True, a dict, or "key=value,..." / "on" / "off".

        >>> KernelProfile.parse("steps=5,every=2m")
        KernelProfile(steps=5, every=120.0, first=10, keep=10, top=10, dir=None)
        """
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls._from_items(value.items())
        if isinstance(value, str):
            text = value.strip()
            if text.lower() in _OFF:
                return None
            if text.lower() in _ON:
                return cls()
            items = []
            for part in text.split(","):
                key, sep, val = part.partition("=")
                if not sep:
                    raise ValueError(f"{part.strip()!r} is not key=value")
                items.append((key.strip(), val.strip()))
            return cls._from_items(items)
        raise ValueError(f"expected True, a dict or 'steps=20,every=10m,...', got {value!r}")

    @classmethod
    def _from_items(cls, items) -> KernelProfile:
        fields = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, val in items:
            if key not in fields:
                raise ValueError(
                    f"unknown setting {key!r}; expected one of {', '.join(sorted(fields))}"
                )
            if key == "dir":
                values[key] = str(val)
            elif key == "every":
                values[key] = parse_duration(val) if isinstance(val, str) else float(val)
            else:
                number = int(val)
                if number < (0 if key == "first" else 1):
                    raise ValueError(f"{key} must be at least {0 if key == 'first' else 1}")
                values[key] = number
        profile = cls(**values)
        if profile.every <= 0:
            raise ValueError("every must be longer than 0s")
        return profile


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)[:60] or "job"


class KernelProfiler:
    """Runs the windows; `step_ended()` is the only call on the training thread."""

    def __init__(self, config: KernelProfile, training_job: str, rank: int):
        import importlib.util

        if importlib.util.find_spec("torch") is None:  # fail at start(), not at a window
            raise ImportError("torch")

        self.config = config
        self.series = KernelSeries(top=config.top)
        self.directory = Path(config.dir or os.path.join(tempfile.gettempdir(), "trainprof-traces"))
        self.prefix = f"{_safe(training_job)}-rank{rank}-"
        self.directory.mkdir(parents=True, exist_ok=True)
        self._seen = 0
        self._next: float | None = None
        self._profiler: Any = None
        self._in_window = 0
        self._overhead = 0.0
        self._windows = 0
        self._no_gpu_said = False
        self._queue: queue.Queue = queue.Queue(maxsize=1)
        self._worker = threading.Thread(
            target=self._work, name="trainprof-kernel-profile", daemon=True
        )
        self._worker.start()
        self.traces: list[Path] = []  # written so far and still kept, oldest first

    # --- training thread -------------------------------------------------------------------

    def step_ended(self) -> None:
        if self._profiler is None:
            if self._next is None:
                self._seen += 1
                if self._seen < self.config.first:
                    return
            elif time.monotonic() < self._next:
                return
            self._begin()
            return
        self._in_window += 1
        if self._in_window >= self.config.steps:
            self._end()
        else:
            t0 = perf_counter()
            self._profiler.step()
            self._overhead += perf_counter() - t0

    def _begin(self) -> None:
        t0 = perf_counter()
        if self._queue.full():  # the last window is still being written: try again later
            self._next = time.monotonic() + min(self.config.every, 60.0)
            return
        try:
            import torch
            import torch.profiler as tp

            if torch._C._autograd._profiler_enabled():
                raise RuntimeError("another profiler is running; trainprof leaves it alone")
            activities = [tp.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(tp.ProfilerActivity.CUDA)
            # A schedule that always records: the same as none, but it makes torch.profiler
            # mark each step with a ProfilerStep#N range, which the step statistics read.
            profiler = tp.profile(
                activities=activities, schedule=lambda _step: tp.ProfilerAction.RECORD
            )
            profiler.start()
        except Exception as e:  # another profiler running, say: skip this window
            self._next = time.monotonic() + self.config.every
            log.warning(
                "trainprof: kernel profile window not started (%s: %s); next try in %gs",
                type(e).__name__,
                e,
                self.config.every,
            )
            return
        self._profiler = profiler
        self._in_window = 0
        self._overhead = perf_counter() - t0

    def _end(self) -> None:
        t0 = perf_counter()
        profiler, self._profiler = self._profiler, None
        self._next = time.monotonic() + self.config.every
        try:
            profiler.stop()
        except Exception as e:
            log.warning("trainprof: kernel profile window dropped (%s: %s)", type(e).__name__, e)
            return
        overhead = self._overhead + perf_counter() - t0
        self._queue.put((profiler, self._in_window, overhead))

    def close(self) -> None:
        """Stop a window in progress (its trace is dropped) and the background thread."""
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            try:
                profiler.stop()
            except Exception:
                pass
        try:
            self._queue.put(None, timeout=30)
        except queue.Full:
            return
        self._worker.join(timeout=60)

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Until the windows ended so far are aggregated (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.01)
        return False

    # --- background thread -----------------------------------------------------------------

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                self._aggregate(*item)
            except Exception as e:  # a bad window must never reach the training loop
                log.warning("trainprof: kernel profile window not aggregated: %s", e)
            finally:
                self._queue.task_done()

    def _aggregate(self, profiler: Any, steps: int, overhead: float) -> None:
        from trainprof.trace.load import read_trace

        self._windows += 1
        path = self.directory / f"{self.prefix}{int(time.time())}-{self._windows}.pt.trace.json.gz"
        profiler.export_chrome_trace(str(path))
        self.traces.append(path)
        self._retain()
        trace = read_trace(path)
        summary = self.series.add_window(trace, steps, overhead)
        if not trace.device:
            if not self._no_gpu_said:
                self._no_gpu_said = True
                log.warning(
                    "trainprof: kernel profile window %d has no GPU activity (CPU-only "
                    "PyTorch, or no CUDA work in these steps): the GPU kernel series are "
                    "absent; CPU operators are recorded. Trace: %s",
                    self._windows,
                    path,
                )
            else:
                log.info("trainprof: kernel profile window %d (CPU only): %s", self._windows, path)
            return
        busy = summary["span_seconds"] - summary["idle_seconds"]
        log.info(
            "trainprof: kernel profile window %d, %d steps, GPU busy %.1f%% of %.3fs: %s",
            self._windows,
            steps,
            100 * busy / summary["span_seconds"] if summary["span_seconds"] else 0.0,
            summary["span_seconds"],
            path,
        )

    def _retain(self) -> None:
        """Keep the newest `keep` traces of this job and rank (a restarted rank's included)."""
        mine = sorted(
            self.directory.glob(f"{self.prefix}*.pt.trace.json.gz"),
            key=lambda p: (p.stat().st_mtime, p.name),
        )
        for old in mine[: max(0, len(mine) - self.config.keep)]:
            try:
                old.unlink()
            except OSError:
                pass
        self.traces = [p for p in self.traces if p.exists()]

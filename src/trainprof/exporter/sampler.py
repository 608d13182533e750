"""The sampling thread: every datapoint interval, read the sources and fold the sample in.

    sources --read--> HostSample --observe--> SampleAccumulator --families--> scrapes
                              \\--> recording (--record)

Ticks are kept on a fixed grid of the monotonic clock: a sample that starts late does not push
the next one later, and a sample that overruns whole intervals skips those ticks instead of
sampling in a burst (said once in the log). The first read only primes the sources (the CPU
ratios and GPM metrics need a previous reading) and is not counted as a datapoint.

A sampler that has not finished a sample for `STALL_INTERVALS` datapoint intervals (at least
`STALL_SECONDS`) is stalled: scrapes then report every collector's
`trainprof_collector_success` as 0, so the stale values they still serve are not taken for
fresh ones (and `rate(trainprof_samples_total[1m]) == 0` says the same to a rule).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from prometheus_client.core import Metric as MetricFamily

from trainprof.contract.sampling import HostSample, SampleAccumulator
from trainprof.exporter.collector import SourceRunner, health_families
from trainprof.exporter.once import Once

log = logging.getLogger("trainprof.exporter")

STALL_INTERVALS = 4
STALL_SECONDS = 5.0


class Sampler:
    """Owns the accumulator; `snapshot()` is the only way scrapes read it."""

    def __init__(
        self,
        runner: SourceRunner,
        accumulator: SampleAccumulator,
        on_sample: Callable[[HostSample], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
    ):
        """`clock` and `sleep` replace the monotonic clock and waiting (tests)."""
        self.runner = runner
        self.accumulator = accumulator
        self.interval = accumulator.interval
        self.samples = 0
        self._on_sample = on_sample
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._health: Mapping[str, tuple[float, float]] = {}
        self._unavailable: Mapping[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._once = Once(log)
        self._last_sample: float | None = None  # clock() when the last sample finished
        self.stall_after = max(STALL_INTERVALS * self.interval, STALL_SECONDS)

    # --- the thread ----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainprof-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop sampling, wait for the sample in progress, close the sources."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the sampler did not stop within %gs", timeout)
                return
        self.runner.close()

    def _run(self) -> None:
        self._last_sample = self._clock()
        self.runner.sample()  # primes the sources; not a datapoint
        next_tick = self._clock() + self.interval
        while not self._wait(max(next_tick - self._clock(), 0.0)):
            try:
                self.sample_once()
            except Exception as e:  # noqa: BLE001 - the thread must outlive a bad sample
                self._once.start(
                    "sample",
                    "a sample failed: %s: %s",
                    type(e).__name__,
                    e,
                    level=logging.ERROR,
                    exc_info=e,
                )
            next_tick += self.interval
            late = self._clock() - next_tick
            if late > 0:
                skipped = int(late // self.interval) + 1
                next_tick += skipped * self.interval
                self._once.start(
                    "overrun",
                    "a sample took longer than the %gs datapoint "
                    "interval; skipped %d tick(s) (collector durations: %s)",
                    self.interval,
                    skipped,
                    self._durations(),
                )
            else:
                self._once.end("overrun", "sampling keeps up with the datapoint interval again")

    def _wait(self, seconds: float) -> bool:
        """Wait `seconds`; True when asked to stop."""
        if self._sleep is None:
            return self._stop.wait(seconds)
        self._sleep(seconds)
        return self._stop.is_set()

    def sample_once(self) -> HostSample:
        """Take one datapoint now (the thread's body; tests call it directly)."""
        sample = self.runner.sample()
        with self._lock:
            self.accumulator.observe(sample)
            self._health = dict(self.runner.health)
            self._unavailable = dict(self.runner.unavailable)
            self.samples += 1
            self._last_sample = self._clock()
        if self._on_sample is not None:
            self._on_sample(sample)
        return sample

    def _durations(self) -> str:
        return ", ".join(
            f"{name} {seconds:.3f}s" for name, (_, seconds) in sorted(self.runner.health.items())
        )

    # --- what scrapes read ---------------------------------------------------------------

    def snapshot(self) -> tuple[int, list[MetricFamily]]:
        """(number of datapoints, every family of the exporter), consistent with each other."""
        with self._lock:
            families = list(self.accumulator.families())
            health = self._health
            unavailable = self._unavailable
            samples = self.samples
            last = self._last_sample
        if last is not None and self._clock() - last > self.stall_after:
            health = {name: (0.0, seconds) for name, (_, seconds) in health.items()}
        families += health_families(health, self.accumulator.identity, unavailable)
        return samples, families

    def families(self) -> list[MetricFamily]:
        return self.snapshot()[1]

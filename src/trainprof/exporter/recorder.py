"""`--record FILE`: keep every sample in trainprof's recording format for `trainprof replay`.

The file starts with a meta record, then holds one host record per datapoint; a `.gz` name
writes gzip. Lines are written every FLUSH_SECONDS (a complete gzip member each time) and on
stop, at exit and on SIGTERM, so a stopped exporter leaves a complete file and a killed one
(`kill -9`) a readable file that lacks at most the last FLUSH_SECONDS.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from trainprof._version import __version__
from trainprof.contract import recording
from trainprof.contract.sampling import HostSample

log = logging.getLogger("trainprof.exporter")

FLUSH_SECONDS = 5.0


class Recorder:
    def __init__(
        self,
        path: str,
        datapoint_interval: float,
        node: str,
        clock: Callable[[], float] = time.monotonic,
    ):
        """Opens (truncates) `path`; raises OSError when it cannot be written."""
        self.path = path
        self._node = node
        self._clock = clock
        self._stream: recording.Appender | None = recording.Appender(path)
        self._stream.write(recording.meta(datapoint_interval, f"trainprof {__version__}"))
        self._stream.flush()
        self._flushed = clock()
        self.records = 0
        recording.close_at_exit(self)

    def __call__(self, sample: HostSample) -> None:
        if self._stream is None:
            return
        try:
            self._stream.write(recording.host_record(self._node, sample))
            self.records += 1
            if self._clock() - self._flushed >= FLUSH_SECONDS:
                self._stream.flush()
                self._flushed = self._clock()
        except OSError as e:
            log.error(
                "cannot write the recording %s (%s); recording stopped after %d "
                "samples, the exporter keeps serving",
                self.path,
                e,
                self.records,
            )
            self._abandon()

    def close(self) -> None:
        if self._stream is None:
            return
        try:
            self._stream.close()
        except OSError as e:
            log.error("cannot finish the recording %s: %s", self.path, e)
        self._stream = None
        log.info("recording %s closed with %d samples", self.path, self.records)

    def _abandon(self) -> None:
        if self._stream is not None:
            self._stream.abandon()
        self._stream = None

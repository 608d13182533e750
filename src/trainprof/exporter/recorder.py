"""`--record FILE`: keep every sample in trainprof's recording format for `trainprof replay`.

The file starts with a meta record, then holds one host record per datapoint; a `.gz` name
writes gzip. Lines are flushed every few seconds and on stop, so a stopped exporter leaves a
complete file.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import IO

from trainprof import recording
from trainprof._version import __version__
from trainprof.sampling import HostSample

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
        stream = recording.open_recording(path, "w")
        self._stream: IO[str] | None = stream  # None once closed or abandoned
        self._writer = recording.Writer(stream)
        self._writer.write(recording.meta(datapoint_interval, f"trainprof {__version__}"))
        stream.flush()
        self._flushed = clock()
        self.records = 0

    def __call__(self, sample: HostSample) -> None:
        if self._stream is None:
            return
        try:
            self._writer.write(recording.host_record(self._node, sample))
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
        try:
            if self._stream is not None:
                self._stream.close()
        except OSError:
            pass
        self._stream = None

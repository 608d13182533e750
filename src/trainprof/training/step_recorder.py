"""The training API's recording: every step of this rank, for `trainprof replay`.

`trainprof.start(record="run.jsonl.gz")` writes this rank's process and step records (the
`trainprof.contract.recording` format) beside what `trainprof exporter --record` writes for the
host, so a job can be replayed later with other rule parameters. The hot path only appends a tuple
to a list; a background thread writes the list out every second.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from trainprof.contract import recording

log = logging.getLogger("trainprof")


def rank_path(path: str, rank: int, world_size: int | None) -> str:
    """One file per rank: `{rank}` in the path is replaced; otherwise, in a job of several
    ranks, `.rank<N>` goes before the suffix (`run.jsonl.gz` -> `run.rank3.jsonl.gz`)."""
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    if not world_size or world_size <= 1:
        return path
    head, tail = path, ""
    for suffix in (".jsonl.gz", ".jsonl", ".gz"):
        if path.endswith(suffix):
            head, tail = path[: -len(suffix)], suffix
            break
    return f"{head}.rank{rank}{tail}"


class StepRecorder:
    """Writes (mode, start, end) steps appended to `log` as step records, with the rank's
    phase totals, every `every` seconds and at `close()` (also at exit and on SIGTERM: see
    `recording.close_at_exit`), which ends the file with an end record. A process killed
    with `kill -9` loses at most the last `every` seconds, and has no end record."""

    def __init__(
        self,
        path: str,
        node: str,
        rank: int,
        process_start: float | None,
        writer: str,
        every: float = 1.0,
        training_job: str | None = None,
        phases: Callable[[], dict[str, float]] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.path, self.node, self.rank = path, node, rank
        self.log: list[tuple[str, float, float]] = []
        self._phases, self._clock = phases, clock
        self._last_phases: dict[str, float] | None = None
        self._out = recording.Appender(path)
        self._out.write({"kind": "meta", "version": recording.VERSION, "writer": writer})
        if process_start is not None:
            self._out.write(recording.process_record(node, rank, process_start, training_job))
        self._out.flush()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._every = every
        self._failed = False
        self._thread = threading.Thread(target=self._run, name="trainprof-record", daemon=True)
        self._thread.start()
        recording.close_at_exit(self)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.flush()

    def flush(self) -> None:
        # list.copy-and-clear under the GIL: the hot path's appends land in one list or
        # the next, never lost.
        steps, self.log[:] = self.log[:], []
        if self._failed:
            return
        with self._lock:
            try:
                for mode, start, end in steps:
                    self._out.write(recording.step_record(self.node, self.rank, mode, start, end))
                phases = self._phases() if self._phases is not None else None
                if phases and phases != self._last_phases:
                    self._last_phases = phases
                    self._out.write(
                        recording.phases_record(self.node, self.rank, self._clock(), phases)
                    )
                self._out.flush()
            except (OSError, ValueError) as e:
                self._failed = True
                log.warning(
                    "trainprof: recording to %s stopped: %s; training goes on", self.path, e
                )

    def close(self) -> None:
        """Write what is left and an end record (when this rank stopped), then close."""
        if self._out.closed:
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(5)
        self.flush()
        with self._lock:
            if not self._failed:
                self._out.write(recording.end_record(self.node, self.rank, self._clock()))
            try:
                self._out.close()
            except OSError:
                pass

    def abandon_in_forked_child(self) -> None:
        """A forked child writes nothing: drop the file without flushing it."""
        self._failed = True
        self.log = []
        self._out.abandon()

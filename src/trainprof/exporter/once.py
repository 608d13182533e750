"""Say a condition once when it starts and once when it ends, not on every sample.

A source sampled twice a second that fails would otherwise write the same line 7,200 times an
hour. `Once` keeps the set of conditions in force:

    >>> import sys
    >>> log = logging.Logger("trainprof.exporter")
    >>> log.addHandler(logging.StreamHandler(sys.stdout))
    >>> once = Once(log)
    >>> once.start("gpu", "no NVIDIA driver on this node (%s)", "NVML Shared Library Not Found")
    no NVIDIA driver on this node (NVML Shared Library Not Found)
    True
    >>> once.start("gpu", "...")          # still in force: not logged again
    False
    >>> once.end("gpu", "NVML is available again")
    NVML is available again
"""

from __future__ import annotations

import logging


class Once:
    def __init__(self, log: logging.Logger):
        self._log = log
        self._active: set[str] = set()

    def start(
        self,
        key: str,
        message: str,
        *args: object,
        level: int = logging.WARNING,
        exc_info: BaseException | None = None,
    ) -> bool:
        """Log `message` if condition `key` was not already in force; True if it logged."""
        if key in self._active:
            return False
        self._active.add(key)
        self._log.log(level, message, *args)
        if exc_info is not None and self._log.isEnabledFor(logging.DEBUG):
            self._log.debug("details of %s", key, exc_info=exc_info)
        return True

    def end(self, key: str, message: str, *args: object) -> None:
        """Log `message` if condition `key` was in force, and clear it."""
        if key in self._active:
            self._active.discard(key)
            self._log.info(message, *args)

    def active(self, key: str) -> bool:
        return key in self._active

"""Regular expressions read from a trial's files, matched within a bound of time.

A collections file names its tensors by `include_regex`; Python's `re` backtracks, so a
pattern such as `^(a+)+$` against forty `a` and a `b` runs for hours. RE2 (Google's engine,
which Prometheus also uses) never backtracks: a match costs time linear in the text.

    >>> compile_pattern("^(a+)+$").search("a" * 40 + "b") is None
    True
    >>> compile_pattern("relu.*_output").search("dense/relu1_output_0") is not None
    True

RE2 refuses what needs backtracking, lookarounds and backreferences, and smdebug's own
default collections use them (`^(?!gradient).*weight`). Such a pattern is matched by Python's
`re`, as smdebug matches it, within `MATCH_BUDGET` seconds over all its matches (a timer
signal interrupts the match); past that it raises `PatternTimeout`, and the caller leaves the
pattern out and says so.

    >>> weights = compile_pattern("^(?!gradient).*weight")
    >>> bool(weights.search("fc.weight")), bool(weights.search("gradient/fc.weight"))
    (True, False)
    >>> try:
    ...     compile_pattern("^(?!b)(a+)+$").search("a" * 40 + "b")
    ... except PatternTimeout as e:
    ...     print(e)
    '^(?!b)(a+)+$': matching took over 2 s (Python's re backtracks on it)
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

from trainprof import extras

# Longer patterns than this are refused unread: no collections file smdebug writes has one.
MAX_PATTERN = 4096
# RE2's memory for one compiled pattern (its own default is 8 MiB).
MAX_MEMORY = 8 << 20
# Seconds a pattern RE2 refuses may spend matching, over all the names it is tried on.
MATCH_BUDGET = 2.0


class PatternError(ValueError):
    """A pattern replay will not run; the message quotes it and says why."""


class PatternTimeout(PatternError):
    """A pattern matched by Python's re ran past MATCH_BUDGET."""


def compile_pattern(pattern: str) -> Any:
    """`pattern` compiled by RE2: an object with `search(text)` and `pattern`."""
    try:
        import re2
    except ModuleNotFoundError as missing:
        raise extras.missing("re2", "reading a SageMaker Debugger trial's collections") from (
            missing
        )
    if not isinstance(pattern, str):
        raise PatternError(f"{pattern!r}: not a regular expression (not text)")
    if len(pattern) > MAX_PATTERN:
        raise PatternError(
            f"{pattern[:40]!r}...: {len(pattern):,} characters long (at most {MAX_PATTERN:,})"
        )
    options = re2.Options()
    options.log_errors = False  # RE2 would print its own line on stderr for each refusal
    options.max_mem = MAX_MEMORY
    try:
        return re2.compile(pattern, options)
    except re2.error:
        pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _Backtracking(pattern, re.compile(pattern))
    except (re.error, RecursionError, OverflowError) as e:
        raise PatternError(f"{pattern!r}: not a regular expression ({e})") from None


class _Expired(Exception):
    pass


class _Backtracking:
    """A pattern matched by Python's re within MATCH_BUDGET seconds in all."""

    def __init__(self, pattern: str, compiled: re.Pattern):
        self.pattern = pattern
        self._compiled = compiled
        self.spent = 0.0

    def search(self, text: str) -> re.Match | None:
        left = MATCH_BUDGET - self.spent
        started = time.perf_counter()
        try:
            if left <= 0:
                raise _Expired
            with _interrupt_after(left):
                return self._compiled.search(text)
        except _Expired:
            raise PatternTimeout(
                f"{self.pattern!r}: matching took over {MATCH_BUDGET:g} s (Python's re "
                "backtracks on it)"
            ) from None
        finally:
            self.spent += time.perf_counter() - started


@contextlib.contextmanager
def _interrupt_after(seconds: float) -> Iterator[None]:
    """Raise _Expired in the block after `seconds` (re checks for signals as it matches).
    Signals reach the main thread only: elsewhere the block runs unbounded."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise _Expired

    handler = signal.signal(signal.SIGALRM, expire)
    before = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, handler)
        if before[0]:
            signal.setitimer(signal.ITIMER_REAL, *before)

"""The hot path: the context managers behind `trainprof.step()`, `trainprof.phase()` and
`trainprof.data()`.

Each `with` costs a few hundred nanoseconds to a microsecond or two (see
benchmarks/step_overhead.py), so these are hand-written classes with `__slots__`: a
`@contextmanager` generator costs about three times as much. Rules every method follows:

* nothing raised inside trainprof reaches the training loop: it is counted in
  `trainprof_instrumentation_errors_total` (the first one is logged with its traceback);
* exceptions from the user's block pass through untouched, and the time still counts;
* the session lock is held only for the bookkeeping after the block, never across user code.

Phases nest, and each counts its *own* time: a phase's time excludes the phases opened
inside it, and a step's time not spent in any phase goes to "other" ("evaluation" for eval
and predict steps). So the phase counters partition the instrumented time and their shares
add up to one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from time import perf_counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainprof.session import Session


class _Noop:
    """What `step()` and `phase()` return where nothing may be recorded (a forked DataLoader
    worker, an unknown mode): a context manager and decorator that does nothing."""

    __slots__ = ()

    def __enter__(self) -> _Noop:
        return self

    def __exit__(self, *exc: object) -> bool:
        return False

    def __call__(self, func: Callable) -> Callable:
        return func

    def cancel(self) -> None:
        pass


NOOP = _Noop()


class _Frame:
    """A timed block on this thread's stack of open frames.

    `__enter__` and `__exit__` are written out in each subclass rather than shared through
    helper methods: a method call is a tenth of the cost of a whole frame here.
    """

    __slots__ = ("_session", "_parent", "_child", "_start", "_done")

    def __enter__(self) -> _Frame:
        session = self._session
        try:
            if session._sync is not None:
                _sync_quietly(session)
            tls = session._tls
            self._parent = getattr(tls, "top", None)
            self._child = 0.0
            self._done = False
            self._start = perf_counter()
            tls.top = self
        except Exception:
            session._error()
        return self

    def cancel(self) -> None:
        """Leave the stack without recording: for a block that turned out to be something
        else (a framework callback's guess at the data wait that included a checkpoint)."""
        try:
            self._pop(self._session._tls)
        except Exception:
            self._session._error()

    def _pop(self, tls: Any) -> _Frame | None:
        """Leave this thread's stack; returns the open frame this one is nested in.

        Frames left out of order (a manual `__exit__`, a generator suspended inside a phase)
        are marked done and skipped, so the stack heals instead of growing.
        """
        self._done = True
        parent = self._parent
        while parent is not None and parent._done:
            parent = parent._parent
        if tls.top is self:
            tls.top = parent
        return parent


class Phase(_Frame):
    """`with trainprof.phase("forward"):` or `@trainprof.phase("forward")`."""

    __slots__ = ("_name",)

    def __init__(self, session: Session, name: str):
        self._session = session
        self._name = name

    def __exit__(self, *exc: object) -> bool:
        session = self._session
        try:
            if session._sync is not None:
                _sync_quietly(session)
            elapsed = perf_counter() - self._start
            if elapsed < 0.0:
                elapsed = 0.0
            parent = self._pop(session._tls)
            if parent is not None:
                parent._child += elapsed
            own = elapsed - self._child
            with session._lock:
                session._state.observe_phase(self._name, own)
        except Exception:
            session._error()
        return False

    def __call__(self, func: Callable) -> Callable:
        from trainprof import session as api

        name = self._name

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with api.phase(name):  # a fresh frame per call: reentrant and thread-safe
                return func(*args, **kwargs)

        return timed


class Step(_Frame):
    """`with trainprof.step(mode="train"):` or `@trainprof.step()`."""

    __slots__ = ("_mode", "_remainder", "_samples", "_tokens")

    def __init__(
        self,
        session: Session,
        mode: str,
        remainder: str,
        samples: float | None,
        tokens: float | None,
    ):
        self._session = session
        self._mode = mode
        self._remainder = remainder
        self._samples = samples
        self._tokens = tokens

    def __exit__(self, *exc: object) -> bool:
        session = self._session
        try:
            if session._sync is not None:
                _sync_quietly(session)
            start = self._start
            elapsed = perf_counter() - start
            if elapsed < 0.0:
                elapsed = 0.0
            parent = self._pop(session._tls)
            if parent is not None:
                parent._child += elapsed
            start += session._offset  # perf_counter -> Unix time
            with session._lock:
                state = session._state
                first = state.first_step_time is None
                state.observe_step(self._mode, start, start + elapsed)
                state.observe_phase(self._remainder, elapsed - self._child)
                steps = session._step_log
                if steps is not None:
                    steps.append((self._mode, start, start + elapsed))
                if self._samples:
                    state.add_samples(self._samples)
                if self._tokens:
                    state.add_tokens(self._tokens)
            if first:
                session._on_first_step()
            kernel = session._kernel
            if kernel is not None:
                kernel.step_ended()
        except Exception:
            session._error()
        return False

    def __call__(self, func: Callable) -> Callable:
        from trainprof import session as api

        mode, samples, tokens = self._mode, self._samples, self._tokens

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with api.step(mode, samples=samples, tokens=tokens):
                return func(*args, **kwargs)

        return timed


def _sync_quietly(session: Session) -> None:
    # A failing sync must not skip popping the frame, or this thread's stack would be wrong.
    try:
        session._sync()
    except Exception:
        session._error()


class TimedIterable:
    """`trainprof.data(loader)`: iterates `loader`, timing each wait for the next item as a
    phase (default "dataloader"). Length and attributes are the wrapped iterable's."""

    def __init__(
        self, session_getter: Callable[[], Session], iterable: Iterable, phase: str = "dataloader"
    ):
        self._session_getter = session_getter
        self._iterable = iterable
        self._phase = phase

    def __iter__(self) -> Iterator:
        # A PyTorch DataLoader says how many worker processes load its batches (the
        # Dataloader rule compares them with the node's cores); read at each epoch.
        try:
            workers = getattr(self._iterable, "num_workers", None)
            if isinstance(workers, int) and not isinstance(workers, bool) and workers >= 0:
                self._session_getter().set_dataloader_workers(workers)
        except Exception:
            pass  # instrumentation never reaches the training loop
        return _TimedIterator(self._session_getter, iter(self._iterable), self._phase)

    def __len__(self) -> int:
        return len(self._iterable)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._iterable, name)


class _TimedIterator:
    __slots__ = ("_session_getter", "_iterator", "_phase")

    def __init__(self, session_getter: Callable[[], Session], iterator: Iterator, phase: str):
        self._session_getter = session_getter
        self._iterator = iterator
        self._phase = phase

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        # The end of the data (StopIteration) is timed too: waiting for it is waiting.
        with self._session_getter().phase(self._phase):
            return next(self._iterator)

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
import threading
from collections.abc import Callable, Iterable, Iterator
from time import perf_counter
from typing import Any, Literal, Protocol

from trainprof.training.state import TrainingState


class _Timed(Protocol):
    """The process's session as the decorators and `trainprof.data()` see it."""

    def step(self, mode: str, samples: float | None, tokens: float | None) -> Any: ...

    def phase(self, name: str) -> Any: ...

    def set_dataloader_workers(self, workers: int) -> None: ...


class HotPath:
    """Everything a timed block touches: the state, its lock, this thread's stack of open
    frames, and what to do on an error or on the first step. The session owns one and hands
    it to each frame, so the frames never reach into the session.

    `__slots__` keep each attribute read as cheap as the session's own were.
    """

    __slots__ = (
        "state",
        "lock",
        "tls",
        "sync",
        "offset",
        "step_log",
        "kernel",
        "error",
        "first_step",
        "current",
    )

    def __init__(
        self,
        state: TrainingState,
        offset: float,
        error: Callable[[], None],
        first_step: Callable[[], None],
        current: Callable[[], _Timed],
    ):
        self.state = state
        self.lock = threading.Lock()
        self.tls = threading.local()  # .top: the innermost open frame of this thread
        self.sync: Callable[[], Any] | None = None  # e.g. torch.cuda.synchronize
        self.offset = offset  # add to perf_counter() for Unix time
        self.step_log: list[tuple[str, float, float]] | None = None  # steps to record
        self.kernel: Any = None  # trace.live.KernelProfiler, told when each step ends
        self.error = error  # counts (and logs once) an exception inside instrumentation
        self.first_step = first_step
        # The process's session when a decorated function is called (a later start() or
        # stop() may have replaced the one that decorated it).
        self.current = current


class _Noop:
    """What `step()` and `phase()` return where nothing may be recorded (a forked DataLoader
    worker, an unknown mode): a context manager and decorator that does nothing."""

    __slots__ = ()

    def __enter__(self) -> _Noop:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
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

    __slots__ = ("_hot", "_parent", "_child", "_start", "_done")

    _hot: HotPath
    _parent: _Frame | None
    _child: float
    _start: float
    _done: bool

    def __enter__(self) -> _Frame:
        hot = self._hot
        try:
            if hot.sync is not None:
                _sync_quietly(hot)
            tls = hot.tls
            self._parent = getattr(tls, "top", None)
            self._child = 0.0
            self._done = False
            self._start = perf_counter()
            tls.top = self
        except Exception:
            hot.error()
        return self

    def cancel(self) -> None:
        """Leave the stack without recording: for a block that turned out to be something
        else (a framework callback's guess at the data wait that included a checkpoint)."""
        try:
            self._pop(self._hot.tls)
        except Exception:
            self._hot.error()

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

    def __init__(self, hot: HotPath, name: str):
        self._hot = hot
        self._name = name

    def __exit__(self, *exc: object) -> Literal[False]:
        hot = self._hot
        try:
            if hot.sync is not None:
                _sync_quietly(hot)
            elapsed = perf_counter() - self._start
            if elapsed < 0.0:
                elapsed = 0.0
            parent = self._pop(hot.tls)
            if parent is not None:
                parent._child += elapsed
            own = elapsed - self._child
            with hot.lock:
                hot.state.observe_phase(self._name, own)
        except Exception:
            hot.error()
        return False

    def __call__(self, func: Callable) -> Callable:
        current = self._hot.current
        name = self._name

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with current().phase(name):  # a fresh frame per call: reentrant and thread-safe
                return func(*args, **kwargs)

        return timed


class Step(_Frame):
    """`with trainprof.step(mode="train"):` or `@trainprof.step()`."""

    __slots__ = ("_mode", "_remainder", "_samples", "_tokens")

    def __init__(
        self,
        hot: HotPath,
        mode: str,
        remainder: str,
        samples: float | None,
        tokens: float | None,
    ):
        self._hot = hot
        self._mode = mode
        self._remainder = remainder
        self._samples = samples
        self._tokens = tokens

    def __exit__(self, *exc: object) -> Literal[False]:
        hot = self._hot
        try:
            if hot.sync is not None:
                _sync_quietly(hot)
            start = self._start
            elapsed = perf_counter() - start
            if elapsed < 0.0:
                elapsed = 0.0
            parent = self._pop(hot.tls)
            if parent is not None:
                parent._child += elapsed
            start += hot.offset  # perf_counter -> Unix time
            with hot.lock:
                state = hot.state
                first = state.first_step_time is None
                state.observe_step(self._mode, start, start + elapsed)
                state.observe_phase(self._remainder, elapsed - self._child)
                steps = hot.step_log
                if steps is not None:
                    steps.append((self._mode, start, start + elapsed))
                if self._samples:
                    state.add_samples(self._samples)
                if self._tokens:
                    state.add_tokens(self._tokens)
            if first:
                hot.first_step()
            kernel = hot.kernel
            if kernel is not None:
                kernel.step_ended()
        except Exception:
            hot.error()
        return False

    def __call__(self, func: Callable) -> Callable:
        current = self._hot.current
        mode, samples, tokens = self._mode, self._samples, self._tokens

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with current().step(mode, samples, tokens):
                return func(*args, **kwargs)

        return timed


def _sync_quietly(hot: HotPath) -> None:
    # A failing sync must not skip popping the frame, or this thread's stack would be wrong.
    try:
        hot.sync()  # type: ignore[misc]  # the caller checked it is not None
    except Exception:
        hot.error()


class TimedIterable:
    """`trainprof.data(loader)`: iterates `loader`, timing each wait for the next item as a
    phase (default "dataloader"). Length and attributes are the wrapped iterable's."""

    def __init__(
        self, session_getter: Callable[[], _Timed], iterable: Iterable, phase: str = "dataloader"
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

    def __init__(self, session_getter: Callable[[], _Timed], iterator: Iterator, phase: str):
        self._session_getter = session_getter
        self._iterator = iterator
        self._phase = phase

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        # The end of the data (StopIteration) is timed too: waiting for it is waiting.
        with self._session_getter().phase(self._phase):
            return next(self._iterator)

"""The hot path: the context managers behind `trainprof.step()`, `trainprof.phase()` and
`trainprof.data()`.

A step with three phases inside costs under twice what the least a Python timer can do
(a hand-written context manager reading the clock on entry and exit; see
benchmarks/step_overhead.py). So these are hand-written classes with `__slots__`, a block
builds no object (each thread reuses one frame per name) and takes no lock. Rules every
method follows:

* nothing raised inside trainprof reaches the training loop: it is counted in
  `trainprof_instrumentation_errors_total` (the first one is logged with its traceback);
* exceptions from the user's block pass through untouched, and the time still counts;
* no block takes the session lock (see `HotPath`), and it is never held across user code.

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


# Steps queued before they are folded into the state under the lock.
FOLD_AT = 256
# Frames kept per thread for reuse (phase names and modes); more names get one per block.
MAX_CACHED_FRAMES = 64


class Account:
    """One thread's own seconds of one phase (its label, as admitted by the state), opened
    when a block of that thread first ends in it. A thread writes only its own accounts, so
    adding to one takes no lock; a scrape adds them up."""

    __slots__ = ("label", "seconds")

    def __init__(self, label: str):
        self.label = label
        self.seconds = 0.0


class ThreadFrames:
    """What one thread's blocks share: its innermost open frame (`top`; each frame links to
    the one it is nested in), its frames for reuse by name, and its accounts by label in the
    order their first block ended."""

    __slots__ = ("top", "frames", "steps", "accounts", "thread")

    def __init__(self) -> None:
        self.top: _Frame | None = None
        self.frames: dict[str, Phase] = {}
        self.steps: dict[Any, Step] = {}
        self.accounts: dict[str, Account] = {}
        self.thread = threading.current_thread()


class HotPath:
    """Everything a timed block touches: the state, its lock, each thread's frames, the
    queue of ended steps, and what to do on an error or on the first step. The session owns
    one and hands it to each frame, so the frames never reach into the session.

    No block takes the lock. A phase adds its own seconds to its thread's account of it; a
    step appends itself to `pending` (atomic, in the order steps ended, whatever thread ended
    them), folded into the state under the lock every `FOLD_AT` steps and before anything
    reads the state. `snapshot()` gives what folding every block into the state as it ended
    would have (the same additions, in the same order, for one thread's blocks).
    """

    __slots__ = (
        "state",
        "lock",
        "tls",
        "threads",
        "pending",
        "sync",
        "offset",
        "_step_log",
        "_kernel",
        "error",
        "log_error",
        "first_step",
        "stepped",
        "watching",
        "current",
    )

    def __init__(
        self,
        state: TrainingState,
        offset: float,
        error: Callable[[], None],
        first_step: Callable[[], None],
        current: Callable[[], _Timed],
        log_error: Callable[[], None] = lambda: None,
    ):
        self.state = state
        self.lock = threading.Lock()
        self.threads: list[ThreadFrames] = []  # every thread that timed a block
        # The calling thread's ThreadFrames as `own`, and its `frames` and `steps`, once it
        # has asked for one (a plain threading.local: a subclass's attributes cost more).
        self.tls = threading.local()
        self.pending: list[tuple[Step, float, float]] = []  # (step, start, end), Unix s
        self.sync: Callable[[], Any] | None = None  # e.g. torch.cuda.synchronize
        self.offset = offset  # add to perf_counter() for Unix time
        self._step_log: list[tuple[str, float, float]] | None = None
        self._kernel: Any = None
        self.error = error  # counts (and logs once) an exception inside instrumentation
        self.log_error = log_error  # logs once: for a caller that counts it itself
        self.first_step = first_step
        self.stepped = False  # whether a step has ended (the first one calls first_step)
        self.watching = True  # whether step_ended() wants each step: see _watch()
        # The process's session when a decorated function is called (a later start() or
        # stop() may have replaced the one that decorated it).
        self.current = current

    @property
    def step_log(self) -> list[tuple[str, float, float]] | None:
        """Where each step's (mode, start, end) goes (a recording), or None."""
        return self._step_log

    @step_log.setter
    def step_log(self, log: list[tuple[str, float, float]] | None) -> None:
        self._step_log = log
        self._watch()

    @property
    def kernel(self) -> Any:
        """The kernel profiler (trace.live.KernelProfiler), told when each step ends."""
        return self._kernel

    @kernel.setter
    def kernel(self, kernel: Any) -> None:
        self._kernel = kernel
        self._watch()

    def _watch(self) -> None:
        self.watching = not self.stepped or self._step_log is not None or self._kernel is not None

    def step_ended(self, mode: str, start: float, end: float) -> None:
        """What a step's end means beyond its series (while `watching`)."""
        log = self._step_log
        if log is not None:
            log.append((mode, start, end))
        if not self.stepped:
            self.stepped = True
            self._watch()
            self.first_step()
        kernel = self._kernel
        if kernel is not None:
            kernel.step_ended()

    # --- handing out frames ------------------------------------------------------------

    def own(self) -> ThreadFrames:
        """The calling thread's frames, made on its first block."""
        tls = self.tls
        try:
            return tls.own
        except AttributeError:
            own = tls.own = ThreadFrames()
            tls.frames, tls.steps = own.frames, own.steps
            with self.lock:
                self.threads.append(own)
            return own

    def phase(self, name: str) -> Phase:
        """This thread's frame for `name`, or a new one where that is open (nested in
        itself) or the thread has many names."""
        own = self.own()
        frames = own.frames
        frame = frames.get(name)
        if frame is None or frame._start is not None:
            frame = (Phase if self.sync is None else _SyncedPhase)(self, own, name)
            if name not in frames and len(frames) < MAX_CACHED_FRAMES:
                frames[name] = frame
        return frame

    def step(self, key: Any, mode: str, remainder: str, samples: Any, tokens: Any) -> Step:
        """A step frame of `mode`; kept for reuse under `key` (the caller's spelling of the
        mode) when it adds no samples or tokens."""
        own = self.own()
        steps = own.steps
        if samples is None and tokens is None:
            frame = steps.get(key)
            if frame is not None and frame._start is None:
                return frame
        kind = Step if self.sync is None else _SyncedStep
        frame = kind(self, own, mode, remainder, samples, tokens)
        if samples is None and tokens is None and key not in steps:
            if len(steps) < MAX_CACHED_FRAMES:
                steps[key] = frame
        return frame

    def set_sync(self, sync: Callable[[], Any] | None) -> None:
        """Synchronise the device with `sync` (None: not) when each block begins and ends,
        from the frames handed out next (the threads' frames kept for reuse are dropped)."""
        with self.lock:
            self.sync = sync
            for own in self.threads:
                own.frames.clear()
                own.steps.clear()

    # --- reading the state ---------------------------------------------------------------

    def account(self, own: ThreadFrames, name: str) -> Account:
        """`own`'s account for phase `name` (admitted by the state: bounded, cut), opened
        now: its first block ended."""
        with self.lock:
            label = self.state.phase_label(name)
            account = own.accounts.get(label)
            if account is None:
                account = own.accounts[label] = Account(label)
            return account

    def fold(self) -> None:
        """Add the queued steps to the state (takes the lock)."""
        with self.lock:
            self.fold_locked()

    def fold_locked(self) -> None:
        """`fold()` for a caller that holds the lock; also moves the accounts of threads
        that ended into the state, so a program that starts many threads holds no more."""
        pending = self.pending
        n = len(pending)
        if n:
            steps = pending[:n]
            del pending[:n]  # what other threads appended meanwhile stays queued
            self.state.fold_steps(steps, self.log_error)
        ended = [t for t in self.threads if not t.thread.is_alive()]
        for own in ended:
            self.threads.remove(own)
            for account in own.accounts.values():
                self.state.observe_phase(account.label, account.seconds)

    def snapshot(self) -> TrainingState:
        """A copy of the state with every block folded in (for a caller holding the lock)."""
        self.fold_locked()
        snapshot = self.state.copy()
        phases = snapshot.phases
        for own in self.threads:
            for account in list(own.accounts.values()):
                phases[account.label] += account.seconds
        return snapshot


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
    """A timed block of one thread, reused for every block of its name on that thread that
    does not nest in another (`HotPath.phase()`): a block builds nothing.

    `__enter__` and `__exit__` are written out in each subclass rather than shared through
    helper methods: a method call is a large part of the cost of a whole block here.
    """

    __slots__ = ("_hot", "_own", "_account", "_parent", "_child", "_start")

    _hot: HotPath
    _own: ThreadFrames
    _account: Account | None
    _parent: _Frame | None
    _child: float
    _start: float | None

    def _init(self, hot: HotPath, own: ThreadFrames) -> None:
        self._hot = hot
        self._own = own
        self._account = None
        self._parent = None
        self._child = 0.0
        self._start = None

    def __enter__(self) -> _Frame:
        try:
            own = self._own
            self._parent = own.top
            own.top = self
            self._child = 0.0
            self._start = perf_counter()
        except Exception:
            self._hot.error()
        return self

    def cancel(self) -> None:
        """Leave the stack without recording: for a block that turned out to be something
        else (a framework callback's guess at the data wait that included a checkpoint)."""
        try:
            if self._start is not None:
                _unlink(self)
        except Exception:
            self._hot.error()


def _unlink(frame: _Frame) -> _Frame | None:
    """Take `frame` off its thread's chain of open frames; returns the open frame it is
    nested in. A frame left out of order (a manual `__exit__`, a generator suspended inside
    a phase) is taken out of the middle, so the chain heals instead of growing."""
    own, parent = frame._own, frame._parent
    frame._start = None
    if own.top is frame:
        own.top = parent
        return parent
    inner = own.top
    while inner is not None and inner._parent is not frame:
        inner = inner._parent
    if inner is not None:
        inner._parent = parent
    return parent


def _ended(frame: _Frame, now: float) -> float | None:
    """Seconds since `frame` was entered, once it leaves its thread's chain and its time is
    added to the frame it is nested in; None when it is not open (exited twice)."""
    start = frame._start
    if start is None:
        return None
    elapsed = now - start
    parent = _unlink(frame)
    if parent is not None:
        parent._child += elapsed
    return elapsed


class Phase(_Frame):
    """`with trainprof.phase("forward"):` or `@trainprof.phase("forward")`."""

    __slots__ = ("_name",)

    def __init__(self, hot: HotPath, own: ThreadFrames, name: str):
        self._init(hot, own)
        self._name = name

    def __exit__(self, exc_type: object, exc: object, tb: object) -> Literal[False]:
        try:
            now = perf_counter()
            own = self._own
            parent = self._parent
            if own.top is self:  # nested properly: the common case, written out
                elapsed = now - self._start  # type: ignore[operator]  # open: it has a start
                self._start = None
                own.top = parent
                if parent is not None:
                    parent._child += elapsed
            else:
                elapsed = _ended(self, now)  # type: ignore[assignment]
                if elapsed is None:
                    return False
            seconds = elapsed - self._child
            account = self._account
            if account is None:
                account = self._account = self._hot.account(own, self._name)
            if seconds > 0.0:
                account.seconds += seconds
        except Exception:
            self._hot.error()
        return False

    def __call__(self, func: Callable) -> Callable:
        current = self._hot.current
        name = self._name

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with current().phase(name):  # this thread's frame, or a new one: reentrant
                return func(*args, **kwargs)

        return timed


class Step(_Frame):
    """`with trainprof.step(mode="train"):` or `@trainprof.step()`."""

    __slots__ = ("mode", "remainder", "samples", "tokens")

    def __init__(
        self,
        hot: HotPath,
        own: ThreadFrames,
        mode: str,
        remainder: str,
        samples: float | None,
        tokens: float | None,
    ):
        self._init(hot, own)
        self.mode = mode
        self.remainder = remainder  # the phase of the step's time spent in no other phase
        self.samples = samples
        self.tokens = tokens

    def __exit__(self, exc_type: object, exc: object, tb: object) -> Literal[False]:
        hot = self._hot
        try:
            now = perf_counter()
            own = self._own
            parent = self._parent
            start = self._start
            if own.top is self:
                elapsed = now - start  # type: ignore[operator]  # open: it has a start
                self._start = None
                own.top = parent
                if parent is not None:
                    parent._child += elapsed
            else:
                elapsed = _ended(self, now)  # type: ignore[assignment]
                if elapsed is None:
                    return False
            seconds = elapsed - self._child
            account = self._account
            if account is None:
                account = self._account = hot.account(own, self.remainder)
            if seconds > 0.0:
                account.seconds += seconds
            start += hot.offset  # type: ignore[operator]  # perf_counter -> Unix time
            end = start + elapsed
            pending = hot.pending
            pending.append((self, start, end))
            if len(pending) >= FOLD_AT:
                hot.fold()
            if hot.watching:
                hot.step_ended(self.mode, start, end)
        except Exception:
            hot.error()
        return False

    def __call__(self, func: Callable) -> Callable:
        current = self._hot.current
        mode, samples, tokens = self.mode, self.samples, self.tokens

        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with current().step(mode, samples, tokens):
                return func(*args, **kwargs)

        return timed


class _SyncedPhase(Phase):
    """A phase that synchronises the device when it begins and ends (`cuda_sync`)."""

    __slots__ = ()

    def __enter__(self) -> _Frame:
        _sync_quietly(self._hot)
        return Phase.__enter__(self)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> Literal[False]:
        _sync_quietly(self._hot)
        return Phase.__exit__(self, exc_type, exc, tb)


class _SyncedStep(Step):
    """A step that synchronises the device when it begins and ends (`cuda_sync`)."""

    __slots__ = ()

    def __enter__(self) -> _Frame:
        _sync_quietly(self._hot)
        return Step.__enter__(self)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> Literal[False]:
        _sync_quietly(self._hot)
        return Step.__exit__(self, exc_type, exc, tb)


def _sync_quietly(hot: HotPath) -> None:
    # A failing sync must not keep the block from timing, or this thread's frames go wrong.
    sync = hot.sync
    if sync is None:  # turned off since this frame was made
        return
    try:
        sync()
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

"""The live training API: one `Session` per process, serving this rank's `/metrics`.

    import trainprof

    trainprof.start()                               # identity from env; serves /metrics
    for batch in trainprof.data(loader):            # phase "dataloader": the wait for each batch
        with trainprof.step(samples=len(batch)):    # steps, duration histogram, timestamps
            with trainprof.phase("forward"):
                loss = model(batch)
            with trainprof.phase("backward"):
                loss.backward()
            with trainprof.phase("optimizer"):
                optimizer.step()

Before `start()` the calls already record (nothing is served); `start()` adopts what was
recorded. `stop()` stops serving and starts over from zero, as a restarted process would.

Ports: each rank serves on `base + LOCAL_RANK` (base `TRAINPROF_BASE_PORT`, default 9946;
9945 is the system exporter's). If that port is taken, the rank tries
`port + k * LOCAL_WORLD_SIZE` for k = 1..3 (ports no other rank of the node prefers), then
gives up serving; either way it logs one warning and training goes on.

Processes: a process forked from a started one (a DataLoader worker) records and serves
nothing: its `step()` and `phase()` do nothing and `start()` refuses, and the inherited
listening socket is closed in it, so the port goes with the rank. prometheus_client's
multiprocess mode is not used (it disables custom collectors): each rank serves its own state.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from time import perf_counter
from typing import Any

from prometheus_client.core import Metric as MetricFamily
from prometheus_client.registry import CollectorRegistry

from trainprof.contract import metrics as contract
from trainprof.contract.metrics import TRAINING_IDENTITY
from trainprof.contract.names import JOB_LABEL
from trainprof.training import process
from trainprof.training.health.state import HealthState
from trainprof.training.identity import Identity, resolve
from trainprof.training.state import STEP_REMAINDER_PHASE, TrainingState, canonical_mode
from trainprof.training.timing import NOOP, HotPath, Phase, Step, TimedIterable

log = logging.getLogger("trainprof")

DEFAULT_BASE_PORT = 9946
SYSTEM_EXPORTER_PORT = 9945
PORT_FALLBACKS = 3


class Session:
    """One process's training metrics: the state, its lock, and the HTTP server.

    Use the module functions (`trainprof.step()`, ...); `trainprof.current()` returns the
    session for its `port`, `identity` and `collector()`.
    """

    def __init__(self) -> None:
        self._hot = HotPath(
            TrainingState(),
            offset=time.time() - perf_counter(),
            error=self._error,
            first_step=self._on_first_step,
            current=current,
            log_error=self._log_error,
        )
        self._state = self._hot.state  # the same object: the session's own bookkeeping
        self._tls = self._hot.tls  # each thread's frames
        self.health = HealthState()
        self.watcher: Any = None  # trainprof.torch.Watcher, with watch()
        # The rule configuration start() was given (or TRAINPROF_RULES_CONFIG): watch()
        # reads it too, so one file drives the rules and what the process computes for them.
        self.rules_config: str | None = None
        self._loss_calls: dict[str, int] = {}
        self._metrics_cut = False
        self._modes: dict[Any, tuple[str, str]] = {}
        self._bad_modes: set[str] = set()
        self._error_logged = False
        self._gpus_explicit = False
        self._framework: tuple[str, str] | None = None
        self.identity: Identity | None = None
        self.server: Any = None
        self.port: int | None = None
        self._file_sd: str | None = None
        self.system: Any = None  # the in-process system exporter, if started here
        self.recorder: Any = None  # StepRecorder, with start(record=...)
        self.started = False
        self._inert = False

    @property
    def inert(self) -> bool:
        """Whether nothing may be recorded here (a forked DataLoader worker)."""
        return self._inert

    @inert.setter
    def inert(self, value: bool) -> None:
        self._inert = value
        if value:  # the module functions hand out the threads' frames: no more of them
            with self._lock:
                for own in self._hot.threads:
                    own.frames.clear()
                    own.steps.clear()

    @property
    def _lock(self) -> threading.Lock:
        return self._hot.lock

    @property
    def _sync(self) -> Callable[[], Any] | None:
        return self._hot.sync

    @property
    def _kernel(self) -> Any:
        """The kernel profiler (trace.live.KernelProfiler), with start(kernel_profile=...)."""
        return self._hot.kernel

    # --- hot path ------------------------------------------------------------------------

    def step(
        self, mode: str = "train", samples: float | None = None, tokens: float | None = None
    ) -> Step | Any:
        if self._inert:
            return NOOP
        try:
            resolved = self._modes.get(mode)
            if resolved is None:
                resolved = self._resolve_mode(mode)
                if resolved is None:
                    return NOOP
            return self._hot.step(mode, resolved[0], resolved[1], samples, tokens)
        except Exception:
            self._error()
            return NOOP

    def phase(self, name: str) -> Phase | Any:
        if self._inert:
            return NOOP
        if type(name) is not str:
            try:
                raise TypeError(f"a phase name must be a str, got {name!r}")
            except TypeError:
                self._error()
            return NOOP
        try:
            return self._hot.phase(name)
        except Exception:
            self._error()
            return NOOP

    def add(self, samples: float = 0, tokens: float = 0) -> None:
        if self.inert:
            return
        try:
            with self._lock:
                self._hot.fold_locked()  # the steps' samples first, in their order
                if samples:
                    self._state.add_samples(samples)
                if tokens:
                    self._state.add_tokens(tokens)
        except Exception:
            self._error()

    def log_loss(self, value: Any, mode: str, step: int | None) -> None:
        if self.inert:
            return
        try:
            resolved = self._modes.get(mode) or self._resolve_mode(mode)
            if resolved is None:
                return
            mode = resolved[0]
            watcher = self.watcher
            if step is None:
                if watcher is not None and mode == "train":
                    step = watcher.step
                    if step % watcher.save_interval:
                        return
                else:
                    step = self._loss_calls.get(mode, 0)
                    self._loss_calls[mode] = step + 1
            loss = float(value.item() if hasattr(value, "item") else value)
            with self._lock:
                self.health.observe_loss(mode, int(step), loss, time.time())
        except Exception:
            self._error()

    def log_metric(self, name: str, value: Any, mode: str) -> None:
        if self.inert:
            return
        try:
            resolved = self._modes.get(mode) or self._resolve_mode(mode)
            if resolved is None:
                return
            number = float(value.item() if hasattr(value, "item") else value)
            with self._lock:
                kept = self.health.observe_metric(str(name)[:64], resolved[0], number)
            if not kept and not self._metrics_cut:
                self._metrics_cut = True
                log.warning(
                    "trainprof: more than %d metric names logged; %r is not published",
                    contract.MAX_LOGGED_METRICS,
                    name,
                )
        except Exception:
            self._error()

    def _resolve_mode(self, mode: Any) -> tuple[str, str] | None:
        try:
            canonical = canonical_mode(mode)
        except ValueError:
            self._error(log_it=False)
            if str(mode) not in self._bad_modes:
                self._bad_modes.add(str(mode))
                log.warning(
                    "trainprof: steps of unknown mode %r are not recorded; expected "
                    "train, eval, predict or global",
                    mode,
                )
            return None
        resolved = self._modes[mode] = (canonical, STEP_REMAINDER_PHASE[canonical])
        return resolved

    def _error(self, log_it: bool = True) -> None:
        """Count an exception caught inside instrumentation; log the first one in full."""
        try:
            with self._lock:
                self._state.count_error()
            if log_it:
                self._log_error()
        except Exception:
            pass

    def _log_error(self) -> None:
        """Log the exception being handled, if it is the first (counting is the caller's)."""
        if not self._error_logged:
            self._error_logged = True
            log.warning(
                "trainprof: an exception inside instrumentation was ignored and "
                "counted in trainprof_instrumentation_errors_total (only the "
                "first one is logged)",
                exc_info=True,
            )

    def set_dataloader_workers(self, workers: int) -> None:
        """What `trainprof.data(loader)` read from the loader's num_workers."""
        try:
            with self._lock:
                self._state.set_dataloader_workers(workers)
        except Exception:
            pass  # instrumentation never reaches the training loop

    def _on_first_step(self) -> None:
        if not self._gpus_explicit:
            self._detect_gpus()

    def _detect_gpus(self) -> None:
        gpus = process.detect_gpus()
        if gpus:
            with self._lock:
                self._state.set_gpus(gpus)

    # --- exposition ----------------------------------------------------------------------

    def families(self) -> Iterator[MetricFamily]:
        """This rank's metric families (what /metrics serves), rendered from a snapshot."""
        # Re-anchor perf_counter to the wall clock on every scrape, off the hot path, so
        # step timestamps follow NTP corrections.
        self._hot.offset = time.time() - perf_counter()
        with self._lock:
            snapshot = self._hot.snapshot()
            health = self.health.copy()
        name, version = self._framework or process.framework_info()
        snapshot.info.update(framework=name, framework_version=version)
        families = itertools.chain(snapshot.families(), health.families(snapshot.identity))
        kernel = self._kernel
        if kernel is None:
            return families
        ident_names = [k for k in TRAINING_IDENTITY if k in snapshot.identity]
        ident = [snapshot.identity[k] for k in ident_names]
        return itertools.chain(families, kernel.series.families(ident_names, ident))

    def collector(self) -> _Collector:
        """A prometheus_client collector of this session, to serve from your own registry."""
        return _Collector(self)

    def value(self, name: str, **labels: str) -> float | None:
        """One sample's current value (tests and debugging)."""
        from trainprof.contract.sampling import sample_value

        return sample_value(self.families(), name, **labels)

    # --- lifecycle -----------------------------------------------------------------------

    def _configure(
        self,
        identity: Identity,
        stddevs: Sequence[float],
        sync: Callable[[], Any] | None,
        gpus: Iterable[tuple[Any, Any]] | None,
        framework: tuple[str, str] | None,
    ) -> None:
        with self._lock:
            self._hot.fold_locked()  # steps before start() counted with the factors then
            state = self._state
            state.identity = identity.labels()
            state.info.update(identity.info())
            state.start_time = process.process_start_time()
            state.add_stddevs(stddevs)
            if gpus is not None:
                state.set_gpus((str(i), str(u)) for i, u in gpus)
        self.identity = identity
        self._hot.set_sync(sync)
        self._gpus_explicit = gpus is not None
        self._framework = framework
        if gpus is None:
            self._detect_gpus()

    def _record(self, path: str, identity: Identity) -> None:
        from trainprof._version import __version__
        from trainprof.training.step_recorder import StepRecorder, rank_path

        rank = identity.rank
        path = rank_path(path, rank, identity.world_size)
        node = identity.node or socket.gethostname()
        try:
            self.recorder = StepRecorder(
                path,
                node,
                rank,
                self._state.start_time,
                f"trainprof {__version__}",
                training_job=identity.training_job,
                phases=self._phase_totals,
            )
        except OSError as e:
            log.warning(
                "trainprof: cannot record to %s: %s; training goes on", path, e.strerror or e
            )
            return
        self._hot.step_log = self.recorder.log

    def _serve(self, addr: str, ports: Sequence[int]) -> None:
        from trainprof.training import rank_server

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        failures = []
        for port in ports:
            try:
                server = rank_server.serve(registry, addr, port)
            except OSError as e:
                failures.append(f"{port} ({e.strerror or e})")
                continue
            self.server, self.port = server, server.address[1]
            if failures:
                log.warning(
                    "trainprof: port %s in use; serving rank metrics on port %d instead",
                    ", ".join(failures),
                    self.port,
                )
            return
        log.warning(
            "trainprof: ports %s not available; not serving metrics for this rank "
            "(training goes on)",
            ", ".join(failures),
        )

    def _phase_totals(self) -> dict[str, float]:
        with self._lock:
            return dict(self._hot.snapshot().phases)

    def _announce(self, directory: str, identity: Identity) -> None:
        from trainprof.deploy import file_sd

        port = self.port
        if port is None:  # not serving: nothing for Prometheus to find
            return
        try:
            path = self._file_sd = file_sd.write(directory, port, identity.labels())
            owner = os.getpid()  # a forked DataLoader worker's exit must not remove it

            def remove_at_exit() -> None:
                if os.getpid() == owner:
                    file_sd.remove(path)

            atexit.register(remove_at_exit)
        except OSError as e:
            log.warning("trainprof: cannot write the file_sd target in %s: %s", directory, e)

    def _shutdown(self) -> None:
        file_sd_path, self._file_sd = self._file_sd, None
        if file_sd_path:
            from trainprof.deploy import file_sd

            file_sd.remove(file_sd_path)
        server, self.server, self.port = self.server, None, None
        if server is not None:
            server.stop()
        system, self.system = self.system, None
        if system is not None:
            system.stop()
        recorder, self.recorder, self._hot.step_log = self.recorder, None, None
        if recorder is not None:
            recorder.close()
        kernel, self._hot.kernel = self._hot.kernel, None
        if kernel is not None:
            kernel.close()

    def _abandon_in_forked_child(self) -> None:
        # Only this thread exists in the child: the server thread did not come along, but its
        # listening socket did. Close the child's copy so the port belongs to the rank alone.
        self.inert = True
        self._file_sd = None
        system, self.system = self.system, None
        if system is not None:
            system.abandon_in_forked_child()
        recorder, self.recorder, self._hot.step_log = self.recorder, None, None
        if recorder is not None:
            recorder.abandon_in_forked_child()
        self._hot.kernel = None  # the profiler and its thread belong to the parent
        self._hot.lock = threading.Lock()
        server, self.server, self.port = self.server, None, None
        if server is not None:
            server.close_socket()


class _Collector:
    """Serves a session's families from a prometheus_client registry."""

    def __init__(self, session: Session):
        self._session = session

    def collect(self) -> Iterator[MetricFamily]:
        try:
            families = list(self._session.families())
        except Exception:
            # A failing render must not fail the scrape of everything else in a registry.
            self._session._error()
            return iter(())
        return iter(families)

    def describe(self) -> list[MetricFamily]:
        return []


def current() -> Session:
    """This process's session (started or not)."""
    return _current


def _use(session: Session) -> None:
    """Make `session` the process's: the one the module functions time into."""
    global _current, _frames
    _current, _frames = session, session._tls


_current = Session()
_frames = _current._tls  # the session's threads' frames, read by step() and phase()


def step(
    mode: str = "train", *, samples: float | None = None, tokens: float | None = None
) -> Step | Any:
    """Time one step: `with trainprof.step():` or as a decorator, `@trainprof.step()`.

    `mode` is train (default), eval, predict or global (framework spellings such as
    "validation" or "ModeKeys.EVAL" are accepted). `samples` and `tokens`, if given, are
    added to `trainprof_training_samples_total` / `_tokens_total` when the step ends.
    """
    if samples is None and tokens is None:
        try:
            frame = _frames.steps[mode]
        except (KeyError, TypeError, AttributeError):  # new here, or not a name
            return _current.step(mode, samples, tokens)
        if frame._start is None:  # not open: a step nested in itself gets its own
            return frame
    return _current.step(mode, samples, tokens)


def phase(name: str) -> Phase | Any:
    """Time a phase: one of `metrics.PHASES` or your own name (at most 16 of your own).

    `with trainprof.phase("forward"):` or `@trainprof.phase("tokenize")`.
    """
    try:
        frame = _frames.frames[name]
    except (KeyError, TypeError, AttributeError):  # new here, or not a name
        return _current.phase(name)
    if frame._start is None:  # not open: a phase nested in itself gets its own
        return frame
    return _current.phase(name)


def data(iterable: Iterable, phase: str = "dataloader") -> TimedIterable:
    """Iterate `iterable`, timing each wait for the next item as `phase`."""
    return TimedIterable(current, iterable, phase)


def add(*, samples: float = 0, tokens: float = 0) -> None:
    """Count samples and tokens processed outside `step(samples=..., tokens=...)`."""
    _current.add(samples, tokens)


def log_loss(value: Any, mode: str = "train", *, step: int | None = None) -> None:
    """Log a loss (a float or a 0-d tensor) for LossNotDecreasing, Overfit, Overtraining.

    `step`: the training step. Given, the loss is saved at that step. Omitted, a train loss
    takes the watcher's step (`trainprof.torch.watch`) and is saved only on the watcher's
    saving steps, so a tensor is read on the host only then; without a watcher (and for
    other modes) each call is the next step of its mode and is saved.
    """
    _current.log_loss(value, mode, step)


def log_metric(name: str, value: Any, mode: str = "train") -> None:
    """Publish the latest value of a metric of your own (accuracy, ...) for custom rules:
    `trainprof_training_metric{metric=name, mode=mode}`. At most 32 names."""
    _current.log_metric(name, value, mode)


def start(
    *,
    training_job: str | None = None,
    node: str | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    serve: bool = True,
    port: int | None = None,
    addr: str = "0.0.0.0",
    rules_config: str | None = None,
    stddevs: Iterable[float] = (),
    cuda_sync: bool | Callable[[], Any] = False,
    gpus: Iterable[tuple[Any, Any]] | None = None,
    framework: str | None = None,
    framework_version: str | None = None,
    system_metrics: bool = False,
    record: str | None = None,
    file_sd_dir: str | None = None,
    kernel_profile: Any = None,
) -> Session:
    """Configure this rank and serve its `/metrics`. Never raises; problems are logged.

    Identity (`training_job`, `node`, `rank`, `local_rank`, `world_size`): explicit
    arguments, else the environment (torchrun, SLURM, MPI, `TRAINPROF_JOB`, `TRAINPROF_NODE`;
    see `trainprof.training.identity`).

    - `port`: serve here instead of `TRAINPROF_BASE_PORT` (default 9946) + local rank;
      0 picks a free port (see `current().port`). `serve=False` serves nothing: register
      `current().collector()` in your own registry instead.
    - `rules_config` (or `TRAINPROF_RULES_CONFIG`): a rule configuration whose StepOutlier
      `stddev` factors are counted besides 2, 3, 4 and 5; `stddevs` adds factors directly.
    - `cuda_sync`: True synchronises CUDA (`torch.cuda.synchronize`) when every step and phase
      begins and ends, so a phase is charged for the GPU work it launched rather than only the
      launches. It blocks the CPU until the GPU is idle, which removes CPU/GPU overlap and
      costs a few microseconds per call even with nothing queued: measure, then leave it off
      for long runs. A callable is used as the sync function.
    - `gpus`: (index, uuid) pairs this rank uses; by default the current CUDA device once
      PyTorch has initialised CUDA (trainprof never initialises it).
    - `framework`, `framework_version`: for `trainprof_training_info` (default: pytorch and
      its version once torch is imported).
    - `record` (or `TRAINPROF_RECORD`): also write this rank's steps to a recording file
      (`.jsonl`, `.jsonl.gz`) for `trainprof replay`; one file per rank (`{rank}` in the path,
      or `.rank<N>` added in a job of several ranks). Steps are written by a background thread
      every second; an unwritable file is one warning.
    - `system_metrics`: on local rank 0, also run the system exporter (`trainprof.exporter`:
      host and GPU samples every 0.5 s) in this process, on `TRAINPROF_EXPORTER_PORT`
      (default 9945), with this rank's `training_job` and `node`. A port already taken (an
      exporter already runs on the node) or a missing `trainprof[exporter]` extra logs one
      warning and training goes on without it.
    - `file_sd_dir` (or `TRAINPROF_FILE_SD_DIR`): write this rank's Prometheus `file_sd`
      target there (`trainprof.deploy.file_sd`; SLURM and bare metal), removed again on `stop()`.
    - `kernel_profile` (or `TRAINPROF_KERNEL_PROFILE`): run `torch.profiler` for a window of
      steps on a schedule and publish the kernel-level series (`trainprof_kernel_*`): True or
      "on" for 20 steps every 10 minutes after 10 warm-up steps, or settings such as
      "steps=50,every=30m,first=10,keep=10,top=10,dir=/scratch/traces" (a dict works too).
      Off by default; see `trainprof.trace.live`.

    Calling `start()` again returns the running session unchanged; `stop()` first to
    restart with other settings.
    """
    global _current
    session = _current
    if session.inert:
        log.warning(
            "trainprof: start() in a process forked from a started one (a DataLoader "
            "worker?) does nothing; only the rank itself serves metrics"
        )
        return session
    if session.started:
        return session
    if _in_dataloader_worker():
        session.inert = True
        return session
    try:
        identity = resolve(
            training_job=training_job,
            node=node,
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            env=os.environ,
        )
        for problem in identity.problems:
            log.warning("trainprof: %s", problem)
        rules_config = rules_config or os.environ.get("TRAINPROF_RULES_CONFIG")
        session.rules_config = rules_config
        factors = list(stddevs) + _rules_stddevs(rules_config)
        settings = health_settings(rules_config) if rules_config else None
        if settings:
            with session._lock:
                session.health.configure(**settings)
        sync = _sync_function(cuda_sync)
        fw = (framework, framework_version or "") if framework else None
        session._configure(identity, factors, sync, gpus, fw)
        if serve:
            session._serve(addr, _ports(port, identity))
        file_sd_dir = file_sd_dir or os.environ.get("TRAINPROF_FILE_SD_DIR")
        if file_sd_dir and session.port:
            session._announce(file_sd_dir, identity)
        profile = (
            kernel_profile
            if kernel_profile is not None
            else os.environ.get("TRAINPROF_KERNEL_PROFILE")
        )
        if profile is not None:
            session._hot.kernel = _start_kernel_profiler(profile, identity)
        record = record or os.environ.get("TRAINPROF_RECORD")
        if record:
            session._record(record, identity)
        if system_metrics and identity.local_rank == 0:
            session.system = _start_system_exporter(rules_config, identity)
        session.started = True
        log.info(
            "trainprof: rank %s (local %s) of %s, %s, serving %s",
            identity.rank,
            identity.local_rank,
            identity.labels().get(JOB_LABEL, "(job from scrape labels)"),
            identity.labels().get("node", "(node from scrape labels)"),
            f"on port {session.port}" if session.port else "nothing",
        )
    except Exception:
        session._error()
        session.started = True
    return session


def _start_kernel_profiler(value: Any, identity: Identity) -> Any:
    from trainprof.trace.live import KernelProfile, KernelProfiler

    try:
        config = KernelProfile.parse(value)
    except ValueError as e:
        log.warning("trainprof: kernel_profile %r: %s; kernel profiling is off", value, e)
        return None
    if config is None:
        return None
    try:
        return KernelProfiler(config, identity.training_job or "job", identity.rank or 0)
    except ImportError:
        log.warning(
            "trainprof: kernel_profile needs torch (torch.profiler), which is not installed: "
            "pip install 'trainprof[torch]'; it is off"
        )
    except OSError as e:
        log.warning("trainprof: kernel_profile: %s; kernel profiling is off", e)
    return None


def _start_system_exporter(rules_config: str | None, identity: Any) -> Any:
    try:
        from trainprof import exporter
        from trainprof.contract.metrics import EXPORTER_IDENTITY

        port = int(os.environ.get("TRAINPROF_EXPORTER_PORT", exporter.DEFAULT_PORT))
        labels = {k: v for k, v in identity.labels().items() if k in EXPORTER_IDENTITY}
        return exporter.start(port=port, rules_config=rules_config, identity=labels)
    except ModuleNotFoundError as e:
        log.warning(
            "trainprof: system_metrics=True needs the exporter extra (%s is missing): "
            "pip install 'trainprof[exporter]'",
            e.name,
        )
    except OSError as e:
        log.warning(
            "trainprof: system exporter not started: %s (is one already running on this node?)", e
        )
    except Exception as e:  # noqa: BLE001 - a bad rules_config must not stop training
        log.warning("trainprof: system exporter not started: %s", e)
    return None


def stop() -> None:
    """Stop serving and start over: a later `start()` begins from zero, as a new process."""
    session = _current
    if session.inert:
        return
    try:
        session._shutdown()
    except Exception:
        log.warning("trainprof: stopping the metrics server failed", exc_info=True)
    _use(Session())


def _ports(port: int | None, identity: Identity) -> list[int]:
    if port == 0:
        return [0]
    if port is None:
        base = DEFAULT_BASE_PORT
        raw = os.environ.get("TRAINPROF_BASE_PORT", "")
        if raw.strip().isdigit():
            base = int(raw)
        elif raw:
            log.warning("trainprof: TRAINPROF_BASE_PORT=%r is not a port; using %d", raw, base)
        port = base + identity.local_rank
    step_ = identity.local_world_size
    return [p for p in (port + k * step_ for k in range(PORT_FALLBACKS + 1)) if p < 65536]


def health_settings(path: str) -> dict[str, Any] | None:
    """What the training process computes for the tensor rules of the configuration at
    `path` (LossNotDecreasing's num_steps, Overtraining's delta, ...), as `HealthState`'s
    and `watch()`'s keyword arguments; None (and one warning) if it cannot be read."""
    try:
        from trainprof.replay.tensors import health_inputs
        from trainprof.rules import files

        inputs = health_inputs(files.read_config(path))
    except Exception as e:  # ConfigError, a missing pyyaml, ...: the defaults
        log.warning(
            "trainprof: cannot read rules_config %s (%s); the tensor rules' inputs are "
            "computed with their defaults",
            path,
            e,
        )
        return None
    return {
        "loss_num_steps": tuple(
            sorted(set(contract.LOSS_NUM_STEPS) | set(inputs["loss_num_steps"]))
        ),
        "loss_delta": inputs.get("loss_delta", 0.01),
        "token_values": inputs["token_values"],
        **{k: inputs[k] for k in ("rtol", "atol", "threshold_inactivity") if k in inputs},
    }


def _rules_stddevs(path: str | None) -> list[float]:
    if not path:
        return []
    try:
        from trainprof.rules import files
        from trainprof.rules.compiler import required_inputs

        return list(required_inputs(files.read_config(path))["step_outlier_stddevs"])
    except Exception as e:  # ConfigError, a missing pyyaml, ...: count the defaults only
        log.warning(
            "trainprof: cannot read rules_config %s (%s); counting step outliers for "
            "the default stddev factors only",
            path,
            e,
        )
        return []


def _sync_function(cuda_sync: bool | Callable[[], Any]) -> Callable[[], Any] | None:
    if callable(cuda_sync):
        return cuda_sync
    if not cuda_sync:
        return None
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        log.warning(
            "trainprof: cuda_sync=True, but PyTorch with CUDA is not loaded; "
            "timing without synchronisation"
        )
        return None
    return torch.cuda.synchronize


def _in_dataloader_worker() -> bool:
    torch = sys.modules.get("torch")
    try:
        return torch is not None and torch.utils.data.get_worker_info() is not None
    except Exception:
        return False


def _after_fork_in_child() -> None:
    old = _current
    if old.started or old.inert:
        old._abandon_in_forked_child()
    else:
        _use(Session())


os.register_at_fork(after_in_child=_after_fork_in_child)

"""SageMaker Debugger tensor trials (`debug-output/`): read, and fold into health series.

A trial as smdebug wrote it:

    debug-output/
      events/000000000010/000000000010_worker_0.tfevents   TFRecord Events, one file per step
      index/000000000/000000000010_worker_0.json           where each tensor sits (not needed)
      collections/000000000/worker_0_collections.json      collection -> tensor names, regexes
      training_job_end.ts                                  written when the job ended

`read_trial` finds the event files and reads each step's when it is asked for (damaged records
and files are skipped and listed in `Trial.problems`), so a trial's memory is one step's
tensors however many steps it saved; `fold` feeds the saved tensors, step by step, through the
same reductions (`trainprof.training.health.reductions`) and `HealthState` as
`trainprof.torch.watch`, and returns one snapshot of the health series per saved step.

What a trial's files may hold is bounded where it is read: a collections file over
`MAX_COLLECTIONS_BYTES` or nested past what `json` parses is skipped, each `include_regex` is
matched by RE2 (linear time; `trainprof.replay.patterns`), a record's tensor is checked against
its bytes before it is allocated (`trainprof.replay.tfrecord`), and a tensor the reductions
cannot take (an empty predictions tensor beside its labels) is skipped; each is reported.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import struct
from array import array
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trainprof import extras
from trainprof.replay.damage import Damage
from trainprof.replay.patterns import PatternError, PatternTimeout, compile_pattern
from trainprof.replay.tfrecord import TensorEvent, decode_event, read_records
from trainprof.training.health.state import HealthState
from trainprof.training.health.trees import DamagedTrees, tree_depth, trees_from_columns

_EVENT_FILE = re.compile(r"^(\d+)_(.+)\.tfevents$")
# Fallbacks when a tensor is in no collection file: smdebug's default naming.
_NAME_RULES = (
    (re.compile(r"^trees/"), "trees"),  # the XGBoost hook's trees_to_dataframe columns
    (re.compile(r"^gradients?/"), "gradients"),
    (re.compile(r"(^|[._/])loss|_loss_output|Loss_output"), "losses"),
    (re.compile(r"relu[^/]*_output", re.I), "relu_output"),
    (re.compile(r"relu[^/]*_input", re.I), "relu_input"),
    (re.compile(r"tanh[^/]*_input", re.I), "tanh_input"),
    (re.compile(r"sigmoid[^/]*_input", re.I), "sigmoid_input"),
    (re.compile(r"labels?$"), "labels"),
    (re.compile(r"predictions?$"), "predictions"),
    (re.compile(r"feature_importance"), "feature_importance"),
    (re.compile(r"embedding\d*_input_\d+$"), "input_sequence"),
    (re.compile(r"_input_\d+$"), "input_image"),
    (re.compile(r"bias$"), "biases"),
    (re.compile(r"weight$"), "weights"),
)


# The collections SageMaker's rule configurations save the inputs in (smdebug-rulesconfig's
# collections.json: CheckInputImages -> input_image, NLPSequenceRatio -> input_sequence), and
# the names smdebug's hooks give their own input collections.
IMAGE_COLLECTIONS = ("input_image", "inputs")
SEQUENCE_COLLECTIONS = ("input_sequence", "tokens")
# A collections file larger than this is skipped unread (smdebug's list a model's tensor
# names: a few MB for the largest models).
MAX_COLLECTIONS_BYTES = 64 << 20
# Errors a damaged record can raise while decoded (tfrecord raises DecodeError, a ValueError;
# the others are what a message of the wrong shape can still give numpy).
_DECODE_ERRORS = (ValueError, IndexError, KeyError, TypeError, struct.error, OverflowError)


class TrialError(ValueError):
    """Not a trial replay can read: the message names the folder and what is missing."""


@dataclasses.dataclass
class Trial:
    root: Path
    steps: Mapping[int, list[TensorEvent]]
    collections: dict[str, set[str]]
    regexes: dict[str, list[Any]]  # RE2 patterns (trainprof.replay.patterns)
    ended: bool
    problems: list[str]
    end_time: float | None = None  # Unix time the job ended (training_job_end.ts)
    _collection: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)

    def collection_of(self, name: str) -> str:
        """The collection a tensor belongs to (smdebug's collection files, else its name)."""
        found = self._collection.get(name)
        if found is None:
            found = self._collection[name] = self._find_collection(name)
        return found

    def _matches(self, collection: str, pattern: Any, name: str) -> bool:
        """Whether `pattern` matches `name`; a pattern out of time is left out, and said."""
        try:
            return pattern.search(name) is not None
        except PatternTimeout as e:
            self.regexes[collection].remove(pattern)
            self.problems.append(
                f"{self.root}: collection {collection!r}: include_regex {e}; left out from "
                f"tensor {name[:80]!r} on"
            )
            return False

    def _find_collection(self, name: str) -> str:
        for collection, names in self.collections.items():
            if name in names and collection not in ("all", "default"):
                return collection
        for collection, patterns in self.regexes.items():
            if collection not in ("all", "default") and any(
                self._matches(collection, p, name) for p in list(patterns)
            ):
                return collection
        for pattern, collection in _NAME_RULES:
            if pattern.search(name):
                return collection
        return "default"


def looks_like_trial(path: str | Path) -> bool:
    root = Path(path)
    return (root / "events").is_dir() or (root / "debug-output" / "events").is_dir()


def read_trial(path: str | Path) -> Trial:
    root = Path(path)
    if (root / "debug-output" / "events").is_dir():
        root = root / "debug-output"
    events = root / "events"
    if not events.is_dir():
        raise TrialError(f"{root}: no events/ folder (not a SageMaker Debugger trial)")
    problems: list[str] = []
    steps = _Steps(events, problems)
    if not steps.files:
        raise TrialError(f"{events}: no .tfevents files")
    collections, regexes = _read_collections(root, problems)
    end_marker = root / "training_job_end.ts"
    ended = end_marker.exists()
    end_time = _end_time(end_marker) if ended else None
    if not ended:
        problems.append(f"{root}: no training_job_end.ts (the job may not have ended)")
    return Trial(root, steps, collections, regexes, ended, problems, end_time)


class _Steps(Mapping[int, list[TensorEvent]]):
    """A trial's saved steps, in step order, each read from its event files when asked for.

    Held: the step numbers of smdebug's folders (events/<step>/<step>_<worker>.tfevents, 8
    bytes a step) and the few files found elsewhere under events/. A step whose files hold
    no readable event is not one of the steps. What a file's damage is goes to `problems`
    the first time the file is read."""

    def __init__(self, events: Path, problems: list[str]):
        self.events = events
        self.problems = problems
        self.files = 0
        self._elsewhere: dict[int, list[Path]] = {}
        self._others: list[str] = []  # files under events/ that are not event files
        found = array("q")
        self.workers: set[str] = set()  # from the files' names, <step>_<worker>.tfevents
        for folder, name, step in self._walk(events):
            self.files += 1
            named = _EVENT_FILE.match(name)
            if named:
                self.workers.add(named.group(2))
            if step is None:
                problems.append(f"{folder / name}: not named <step>_<worker>.tfevents; skipped")
            elif folder.parent == events and folder.name == f"{step:012d}":
                found.append(step)
            else:
                self._elsewhere.setdefault(step, []).append(folder / name)
                found.append(step)
        self._steps: Any = np.unique(np.frombuffer(found, dtype=np.int64)) if found else []
        if self._others:
            more = f" and {len(self._others) - 5} more" if len(self._others) > 5 else ""
            problems.append(
                f"{events}: skipped {len(self._others)} file(s) not named *.tfevents: "
                + ", ".join(self._others[:5])
                + more
            )
        self._said = bytearray(len(self._steps))  # 1: that step's problems are said

    @property
    def numbers(self) -> Sequence[int]:
        """The steps the event files are named for, in order (a step whose files hold no
        readable event among them)."""
        return self._steps

    def _walk(self, top: Path) -> Iterator[tuple[Path, str, int | None]]:
        """(folder, name, step in the name or None) of every .tfevents file under `top`,
        links to folders not followed; no folder's listing is held beyond its own."""
        pending = [top]
        while pending:
            folder = pending.pop()
            try:
                with os.scandir(folder) as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(Path(entry.path))
                        elif entry.name.endswith(".tfevents") and entry.is_file():
                            named = _EVENT_FILE.match(entry.name)
                            yield folder, entry.name, int(named.group(1)) if named else None
                        elif len(self._others) < 1000:
                            self._others.append(os.path.relpath(entry.path, top))
            except OSError as e:
                self.problems.append(f"{folder}: cannot list ({e.strerror or e}); skipped")

    def _files_of(self, step: int) -> list[Path]:
        folder = self.events / f"{step:012d}"
        names: list[str] = []
        try:
            with os.scandir(folder) as entries:
                names = [e.name for e in entries if e.is_file()]
        except OSError:
            pass
        own = [folder / n for n in sorted(names) if _step_of(n) == step]
        return own + sorted(self._elsewhere.get(step, []))

    def _read(self, index: int, step: int) -> list[TensorEvent]:
        problems = [] if self._said[index] else self.problems
        self._said[index] = 1
        out: list[TensorEvent] = []
        for file in self._files_of(step):
            named = _EVENT_FILE.match(file.name)
            worker = named.group(2) if named else ""
            for record in read_records(file, problems):
                try:
                    decoded = list(decode_event(record))
                except _DECODE_ERRORS as e:
                    problems.append(f"{file}: an event could not be decoded ({e}); skipped")
                    continue
                for event in decoded:
                    if event.step != step:
                        problems.append(
                            f"{file}: an event of step {event.step} in the file of step {step}; "
                            "skipped"
                        )
                        continue
                    event.worker = worker
                    out.append(event)
        return out

    def items(self) -> Iterator[tuple[int, list[TensorEvent]]]:  # type: ignore[override]
        for index, step in enumerate(self._steps):
            events = self._read(index, int(step))
            if events:
                yield int(step), events

    def values(self) -> Iterator[list[TensorEvent]]:  # type: ignore[override]
        return (events for _, events in self.items())

    def __iter__(self) -> Iterator[int]:
        return (step for step, _ in self.items())

    def __len__(self) -> int:
        return sum(1 for _ in self.items())

    def __getitem__(self, step: int) -> list[TensorEvent]:
        position = int(np.searchsorted(self._steps, step))
        if position < len(self._steps) and self._steps[position] == step:
            events = self._read(position, step)
            if events:
                return events
        raise KeyError(step)

    def __contains__(self, step: object) -> bool:
        try:
            self[step]  # type: ignore[index]
        except (KeyError, TypeError):
            return False
        return True


def _step_of(name: str) -> int | None:
    named = _EVENT_FILE.match(name)
    return int(named.group(1)) if named else None


def _end_time(marker: Path) -> float | None:
    """When the job ended, if the marker says (a Unix time in it); its mtime is not trusted:
    copying a trial changes it, and real markers are usually empty."""
    try:
        with open(marker, "rb") as f:
            return float(f.read(64).decode("ascii").strip())
    except (OSError, ValueError):
        return None


def _read_collections(root: Path, problems: list[str]):
    collections: dict[str, set[str]] = {}
    regexes: dict[str, list[Any]] = {}
    for file in sorted((root / "collections").rglob("*.json")):
        data = _collections_file(file, problems)
        if data is None:
            continue
        for name, c in data.items():
            if not isinstance(c, dict):
                problems.append(f"{file}: collection {name!r} is not an object; skipped")
                continue
            names = c.get("tensor_names") or []
            if isinstance(names, list) and all(isinstance(n, str) for n in names):
                collections.setdefault(name, set()).update(names)
            else:
                problems.append(
                    f"{file}: collection {name!r}: tensor_names is not a list of names; skipped"
                )
            patterns = c.get("include_regex") or []
            if not isinstance(patterns, list):
                problems.append(
                    f"{file}: collection {name!r}: include_regex is not a list of patterns; skipped"
                )
                continue
            for pattern in patterns:
                try:
                    regexes.setdefault(name, []).append(compile_pattern(pattern))
                except PatternError as e:
                    problems.append(f"{file}: collection {name!r}: include_regex {e}; skipped")
    return collections, regexes


def _collections_file(file: Path, problems: list[str]) -> dict[str, Any] | None:
    """The `collections` object of one collections file; None (reported) when it cannot be."""
    try:
        size = file.stat().st_size
        if size > MAX_COLLECTIONS_BYTES:
            problems.append(
                f"{file}: {size:,} bytes, larger than a collections file is "
                f"({MAX_COLLECTIONS_BYTES:,}); skipped unread"
            )
            return None
        data = json.loads(file.read_bytes())
    except OSError as e:
        problems.append(f"{file}: unreadable collection file ({e.strerror or e}); skipped")
        return None
    except RecursionError:
        problems.append(f"{file}: not a collection file (JSON nested too deeply); skipped")
        return None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        problems.append(f"{file}: unreadable collection file ({e}); skipped")
        return None
    found = data.get("collections") if isinstance(data, dict) else None
    if not isinstance(found, dict):
        problems.append(f"{file}: no collections object; skipped")
        return None
    return found


@dataclasses.dataclass
class Snapshot:
    """The health series after one saved step."""

    step: int
    wall_time: float
    state: HealthState


def fold(
    trial: Trial,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    threshold_inactivity: float = 1.0,
    include_regex: str | None = None,
    state: HealthState | None = None,
    image_regex: str | None = None,
    tokens_regex: str | None = None,
) -> Iterator[Snapshot]:
    """Feed the trial's saved steps, in order, through the reductions into a HealthState.

    Input images are the tensors of the collections `input_image` (SageMaker's, for
    CheckInputImages) or `inputs`, or named by `image_regex` (CheckInputImages' `regex`);
    token ids those of `input_sequence` or `tokens`, or named by `tokens_regex`
    (NLPSequenceRatio's). Losses are compared at their mode's steps, as smdebug's
    `tensor.value(step, mode)` reads them. In a trial of several workers a tensor is one per
    worker. A step whose `trees` collection is damaged is left out of the tree depth and
    reported in `trial.problems` once the fold ends."""
    try:
        import torch
    except ModuleNotFoundError as missing:
        raise extras.reraise(missing, "replaying a SageMaker Debugger tensor trial") from None

    from trainprof.contract import metrics as contract
    from trainprof.training.health import reductions as r

    state = state or HealthState()
    include = re.compile(include_regex) if include_regex else None
    images = re.compile(image_regex) if image_regex else None
    sequences = re.compile(tokens_regex) if tokens_regex else None
    workers = getattr(trial.steps, "workers", None)
    if workers is None:  # steps given as a plain mapping
        workers = {e.worker for events in trial.steps.values() for e in events}
    previous: dict[tuple[str, str], torch.Tensor] = {}
    damage = Damage()
    deepest: int | None = None
    for step, events in trial.steps.items():
        labels, predictions = {}, {}
        tree_columns: dict[str, list[np.ndarray]] = {}
        wall_time = max((e.wall_time for e in events), default=0.0)
        tensors_seen = False
        for e in events:
            collection = trial.collection_of(e.name)
            if collection == "trees":
                column = e.name.rsplit("/", 1)[-1]
                tree_columns.setdefault(column, []).append(e.value.reshape(-1))
                continue
            if e.value.dtype.kind in "US":
                continue
            t = torch.from_numpy(np.array(e.value))  # a writable copy
            if not t.numel():
                damage.skip("step(s) with an empty tensor, not reduced", f"{e.name} at step {step}")
                continue
            if collection == "losses":
                if t.numel():
                    loss = float(t.double().mean())
                    state.observe_loss(e.mode, step, loss, mode_step=e.mode_step)
                continue
            if collection == "labels":
                labels[e.name] = t
                continue
            if collection == "predictions":
                predictions[e.name] = t
                continue
            if collection == "feature_importance":
                continue
            if images and images.search(e.name) and collection not in SEQUENCE_COLLECTIONS:
                collection = IMAGE_COLLECTIONS[0]
            if sequences and sequences.search(e.name):
                collection = SEQUENCE_COLLECTIONS[0]
            if collection in SEQUENCE_COLLECTIONS or (
                collection in IMAGE_COLLECTIONS and t.dtype.is_floating_point is False
            ):
                counts = r.token_counts(t, tuple(int(v) for v in state.token_matches)).tolist()
                state.observe_tokens(
                    counts[0], dict(zip(map(int, state.token_matches), counts[1:]))
                )
                continue
            if collection in IMAGE_COLLECTIONS:
                if t.dim() >= 2:
                    sums = r.channel_sums(t, contract.MAX_CHANNELS).tolist()
                    state.observe_inputs(float(t.shape[0]), dict(enumerate(sums)))
                continue
            tensors_seen = True
            name = e.name if len(workers) < 2 else f"{e.worker}/{e.name}"
            key = (collection, name)
            if collection == "relu_output":
                values = {"dead_ratio": float(r.dead_ratio(t, threshold_inactivity))}
            elif collection == "relu_input":
                values = {"variance": float(r.variance(t))}
            elif collection in ("tanh_input", "sigmoid_input"):
                bounds = r.TANH_BOUNDS if collection == "tanh_input" else r.SIGMOID_BOUNDS
                values = {
                    "saturated_ratio": float(r.saturated_ratio(t, bounds, threshold_inactivity)),
                    "variance": float(r.variance(t)),
                }
            else:
                values = dict(zip(r.STATISTICS, r.stats(t).tolist()))
                if collection == "gradients":
                    values["spread"] = float(r.spread(t))
                before = previous.get(key)
                if before is not None:
                    values["allclose"] = float(r.allclose(t, before, rtol, atol))
                    if collection in ("weights", "biases") and before.shape == t.shape:
                        values["update_ratio"] = float(r.update_ratio(before, t))
                previous[key] = t
            included = bool(include and include.search(f"{collection}/{e.name}"))
            state.observe_tensor(collection, name, values, included)
        importances = [
            float(np.asarray(e.value, dtype=float).sum())
            for e in events
            if trial.collection_of(e.name) == "feature_importance" and e.value.dtype.kind in "fiu"
        ]
        if importances:
            state.observe_feature_importance(importances)
        depth = _deepest_tree(tree_columns, f"{trial.root}/events/{step:012d}", damage)
        if depth is not None:
            deepest = depth if deepest is None else max(deepest, depth)
            state.observe_tree_depth(deepest)
        for pair in _pairs(labels, predictions):
            lab, pred = pair
            if pred.dim() > lab.dim():
                pred = pred.argmax(dim=-1)
            if pred.numel() != lab.numel():
                where = f"step {step}"
                damage.skip("step(s) whose labels and predictions differ in size", where)
                continue
            k = contract.MAX_CLASSES + 1
            counts = r.confusion_pairs(lab, pred, k).tolist()
            state.observe_classes({(i // k, i % k): n for i, n in enumerate(counts) if n}, step)
        if tensors_seen:
            state.observe_save(step, wall_time)
        yield Snapshot(step, wall_time, state)
    trial.problems.extend(damage.notes())


def _deepest_tree(columns: dict[str, list[np.ndarray]], where: str, damage: Damage) -> int | None:
    """Depth of the deepest tree the `trees` columns of one step hold (the XGBoost hook
    saves the tree of the step's boosting round), None without a readable one. A column
    saved twice at a step (two workers) is read as two tables, in the order saved."""
    deepest = None
    for k in range(max((len(arrays) for arrays in columns.values()), default=0)):
        table = {name: arrays[k] for name, arrays in columns.items() if k < len(arrays)}
        try:
            roots = trees_from_columns(table)
        except DamagedTrees as e:
            damage.skip(f"step(s) whose trees collection is damaged ({e})", where)
            continue
        for root in roots.values():
            deepest = max(deepest or 0, tree_depth(root))
    return deepest


def _pairs(labels: dict, predictions: dict):
    """Labels and predictions saved at a step, paired by name (`x_labels` / `x_predictions`),
    or the only two of each."""
    if len(labels) == 1 and len(predictions) == 1:
        yield next(iter(labels.values())), next(iter(predictions.values()))
        return
    for name, lab in labels.items():
        stem = re.sub(r"labels?$", "", name)
        for pname, pred in predictions.items():
            if re.sub(r"predictions?$", "", pname) == stem:
                yield lab, pred

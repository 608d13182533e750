"""SageMaker Debugger tensor trials (`debug-output/`): read, and fold into health series.

A trial as smdebug wrote it:

    debug-output/
      events/000000000010/000000000010_worker_0.tfevents   TFRecord Events, one file per step
      index/000000000/000000000010_worker_0.json           where each tensor sits (not needed)
      collections/000000000/worker_0_collections.json      collection -> tensor names, regexes
      training_job_end.ts                                  written when the job ended

`read_trial` reads every event file (damaged records and files are skipped and listed in
`Trial.problems`); `fold` feeds the saved tensors, step by step, through the same reductions
(`trainprof.training.health.reductions`) and `HealthState` as `trainprof.torch.watch`, and returns
one snapshot of the health series per saved step.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from trainprof import extras
from trainprof.replay.damage import Damage
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


class TrialError(ValueError):
    """Not a trial replay can read: the message names the folder and what is missing."""


@dataclasses.dataclass
class Trial:
    root: Path
    steps: dict[int, list[TensorEvent]]
    collections: dict[str, set[str]]
    regexes: dict[str, list[re.Pattern]]
    ended: bool
    problems: list[str]
    end_time: float | None = None  # Unix time the job ended (training_job_end.ts)

    def collection_of(self, name: str) -> str:
        """The collection a tensor belongs to (smdebug's collection files, else its name)."""
        for collection, names in self.collections.items():
            if name in names and collection not in ("all", "default"):
                return collection
        for collection, patterns in self.regexes.items():
            if collection not in ("all", "default") and any(p.search(name) for p in patterns):
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
    steps: dict[int, list[TensorEvent]] = {}
    files = sorted(p for p in events.rglob("*.tfevents") if p.is_file())
    if not files:
        raise TrialError(f"{events}: no .tfevents files")
    for file in files:
        named = _EVENT_FILE.match(file.name)
        if not named:
            problems.append(f"{file}: not named <step>_<worker>.tfevents; skipped")
            continue
        for record in read_records(file, problems):
            try:
                for event in decode_event(record):
                    event.worker = named.group(2)
                    steps.setdefault(event.step, []).append(event)
            except (ValueError, IndexError, KeyError) as e:
                problems.append(f"{file}: an event could not be decoded ({e}); skipped")
    collections, regexes = _read_collections(root, problems)
    end_marker = root / "training_job_end.ts"
    ended = end_marker.exists()
    end_time = _end_time(end_marker) if ended else None
    if not ended:
        problems.append(f"{root}: no training_job_end.ts (the job may not have ended)")
    return Trial(root, dict(sorted(steps.items())), collections, regexes, ended, problems, end_time)


def _end_time(marker: Path) -> float | None:
    """When the job ended, if the marker says (a Unix time in it); its mtime is not trusted:
    copying a trial changes it, and real markers are usually empty."""
    try:
        return float(marker.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_collections(root: Path, problems: list[str]):
    collections: dict[str, set[str]] = {}
    regexes: dict[str, list[re.Pattern]] = {}
    for file in sorted((root / "collections").rglob("*.json")):
        try:
            data = json.loads(file.read_text())
            for name, c in (data.get("collections") or {}).items():
                collections.setdefault(name, set()).update(c.get("tensor_names") or [])
                for pattern in c.get("include_regex") or []:
                    try:
                        regexes.setdefault(name, []).append(re.compile(pattern))
                    except re.error:
                        problems.append(f"{file}: collection {name}: bad regex {pattern!r}")
        except (OSError, ValueError, AttributeError) as e:
            problems.append(f"{file}: unreadable collection file ({e}); skipped")
    return collections, regexes


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

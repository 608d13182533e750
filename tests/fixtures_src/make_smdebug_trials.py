"""Writes the SageMaker Debugger trials under tests/data/smdebug-trials/ with smdebug's own code.

Run it in a separate virtualenv (smdebug 1.0.34 needs numpy<2 and protobuf<4):

    python3 -m venv .venv-smdebug
    .venv-smdebug/bin/pip install smdebug==1.0.34 'numpy<2' 'protobuf<4' requests psutil
    .venv-smdebug/bin/python tests/fixtures_src/make_smdebug_trials.py

Every tensor goes through smdebug's `FileWriter(trial_dir, step, worker)` at its defaults
(`write_checksum=False`: each record's footer is the masked CRC of CHECKSUM_MAGIC_BYTES), which
also writes the index files; collections are smdebug `Collection`s exported by its
`CollectionManager` as the hook exports them (`collections/000000000/<worker>_collections.json`,
with SageMaker's include regexes from smdebug-rulesconfig's collections.json), and
`training_job_end.ts` marks the end as the hook does.

Each trial's `smdebug-read.json` is what smdebug's own reader (`smdebug.trials.create_trial`)
reads back: every tensor at every step, mode and worker, and each collection's tensors. The
tests judge SageMaker's rule semantics on that reading (tests/sagemaker_oracle.py) and
trainprof's replay on the binary trial. `cases.json` lists the cases: rule, parameters and
whether the case was written to fire.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
from smdebug.core.collection import Collection
from smdebug.core.collection_manager import CollectionManager
from smdebug.core.modes import ModeKeys
from smdebug.core.reader import FileReader
from smdebug.core.save_config import SaveConfig
from smdebug.core.writer import FileWriter
from smdebug.trials import create_trial

OUT = Path(__file__).resolve().parent.parent / "data" / "smdebug-trials"
WALL = 1_780_000_000.0
TRAIN, EVAL = ModeKeys.TRAIN, ModeKeys.EVAL
# SageMaker's collection configurations (smdebug-rulesconfig collections.json).
SAGEMAKER_REGEX = {
    "input_image": [".*hybridsequential0_input_0"],
    "input_sequence": [".*embedding0_input_0"],
    "relu_output": [".*relu_output"],
    "relu_input": [".*relu_input"],
}


class Trial:
    """One trial: saves (global step, worker, mode, mode step, tensors) and collections."""

    def __init__(self, workers=("worker_0",), save_interval=1):
        self.saves: list[tuple[int, str, ModeKeys, int, dict[str, np.ndarray]]] = []
        self.workers = workers
        self.membership: dict[str, str] = {}  # tensor -> collection
        self.save_interval = save_interval
        self.regex = dict(SAGEMAKER_REGEX)
        self.times: dict[int, float] = {}  # step -> the wall time its events carry

    def save(self, step, tensors, collection, mode=TRAIN, mode_step=None, worker=None):
        worker = worker or self.workers[0]
        mode_step = step if mode_step is None else mode_step
        for other in self.saves:  # a hook's global step has one mode
            assert other[0] != step or other[2:4] == (mode, mode_step), (step, mode)
        for name in tensors:
            self.membership[name] = collection
        self.saves.append((step, worker, mode, mode_step, tensors))
        return self

    def write(self, root: Path) -> None:
        by_file: dict[tuple[int, str], list] = {}
        for step, worker, mode, mode_step, tensors in self.saves:
            by_file.setdefault((step, worker), []).append((mode, mode_step, tensors))
        for (step, worker), items in sorted(by_file.items()):
            writer = FileWriter(trial_dir=str(root), step=step, worker=worker)
            for mode, mode_step, tensors in items:
                for name, value in tensors.items():
                    writer.write_tensor(
                        tdata=np.asarray(value),
                        tname=name,
                        mode=mode,
                        mode_step=mode_step,
                        timestamp=self.times.get(step, WALL + step),
                    )
            writer.close()
        for worker in self.workers:
            manager = CollectionManager()
            for name in sorted(set(self.membership.values())):
                collection = Collection(name, include_regex=self.regex.get(name))
                collection.save_config = SaveConfig(save_interval=self.save_interval)
                manager.add(collection)
            for tensor, name in self.membership.items():
                manager.get(name).add_tensor_name(tensor)
            manager.set_num_workers(len(self.workers))
            manager.export(str(root), f"{worker}_collections.json")
        (root / "training_job_end.ts").write_text("")


def read_back(root: Path) -> dict:
    """What smdebug's reader sees in the trial."""
    trial = create_trial(str(root))
    tensors = []
    for name in trial.tensor_names():
        tensor = trial.tensor(name)
        for step in tensor.steps():
            mode, mode_step = trial.mode_modestep(step)
            for worker in sorted(tensor.workers(step)):
                value = tensor.value(step, worker=worker)
                assert (
                    tensor.value(mode_step, mode=mode, worker=worker).tobytes() == value.tobytes()
                )
                tensors.append(
                    {
                        "name": name,
                        "step": int(step),
                        "mode": mode.name,
                        "mode_step": int(mode_step),
                        "worker": worker,
                        "dtype": str(value.dtype),
                        "shape": list(value.shape),
                        "value": _plain(value),
                    }
                )
    stamps = {}
    for path in sorted((root / "events").rglob("*.tfevents")):
        worker = path.name.split("_", 1)[1].rsplit(".", 1)[0]
        for e in FileReader(str(path)).read_events():
            stamps[(e["step"], worker, e["name"])] = e["timestamp"]
    for t in tensors:
        t["wall_time"] = stamps[(t["step"], t["worker"], t["name"])]
    tensors.sort(key=lambda t: (t["step"], t["worker"], t["name"]))
    collections = {
        name: sorted(trial.tensor_names(collection=name))
        for name in sorted(trial.collections())
        if name not in ("all", "default")
    }
    return {
        "steps": [int(s) for s in trial.steps()],
        "collections": collections,
        "tensors": tensors,
    }


def _plain(value: np.ndarray):
    if value.dtype.kind == "f":
        return [_float(v) for v in value.reshape(-1)]
    return [v.item() if hasattr(v, "item") else v for v in value.reshape(-1)]


def _float(v) -> float | str:
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return float(v)


# --- the cases ------------------------------------------------------------------------------

rng = np.random.default_rng(27)


def f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def scaled(mean_abs: float, shape=(4, 5)) -> np.ndarray:
    """A tensor of mixed signs whose mean |x| is `mean_abs`."""
    x = rng.uniform(0.5, 1.5, size=shape) * rng.choice([-1, 1], size=shape)
    return f32(x / np.abs(x).mean() * mean_abs)


def grads(values, workers=("worker_0",), bad_worker=None, bad_from=None, bad=1e-5):
    t = Trial(workers)
    for step, v in enumerate(values):
        for worker in workers:
            mean = bad if worker == bad_worker and step >= bad_from else v
            t.save(step, {"gradient/fc1.weight": scaled(mean)}, "gradients", worker=worker)
            t.save(step, {"gradient/fc2.weight": scaled(v * 3)}, "gradients", worker=worker)
            t.save(step, {"fc1.weight": scaled(0.1)}, "weights", worker=worker)
    return t


def with_value(step_values: dict[int, float], collection: str, name: str, steps=5, base=None):
    """`name` holds ordinary values, with `step_values[step]` put in at those steps."""
    t = Trial()
    for step in range(steps):
        x = scaled(0.5) if base is None else base(step)
        if step in step_values:
            x = x.copy()
            x[1, 2] = step_values[step]
        t.save(step, {name: x}, collection)
        t.save(
            step,
            {"fc1.weight": scaled(0.2) if collection != "weights" else scaled(0.3)},
            "weights" if collection != "weights" else "biases",
        )
    return t


def losses(train: list, eval_: list | None = None, train_every=1, eval_at=()):
    """Train losses saved every `train_every` steps; eval losses at global steps `eval_at`
    (odd, between the train steps), with eval mode steps 0, 2, 4, ..."""
    t = Trial()
    for i, v in enumerate(train):
        # every step a train step unless eval steps come between: then every other one
        mode_step = i if eval_at else i * train_every
        t.save(i * train_every, {"CrossEntropyLoss_output_0": f32([v])}, "losses", TRAIN, mode_step)
    for i, (step, v) in enumerate(zip(eval_at, eval_ or [])):
        t.save(step, {"CrossEntropyLoss_output_0": f32([v])}, "losses", EVAL, 2 * i)
    return t


def zeros(fraction: float, shape=(4, 5)) -> np.ndarray:
    x = scaled(0.5, shape).reshape(-1)
    x[: int(round(fraction * x.size))] = 0
    return f32(rng.permutation(x).reshape(shape))


def with_variance(var: float, shape=(4, 5)) -> np.ndarray:
    x = rng.normal(size=shape)
    x = (x - x.mean()) / x.std()
    return f32(x * np.sqrt(var) + 1.0)


def relu(active_share: dict[int, float], units=10, samples=40) -> np.ndarray:
    """ReLU outputs (samples x units): unit u positive in active_share.get(u, .5) of samples."""
    out = np.zeros((samples, units), dtype=np.float32)
    for u in range(units):
        k = int(round(active_share.get(u, 0.5) * samples))
        rows = rng.permutation(samples)[:k]
        out[rows, u] = rng.uniform(0.1, 2.0, size=k)
    return out


def tanh_in(saturated_share: dict[int, float], units=10, samples=40) -> np.ndarray:
    """tanh inputs: unit u inside (-9.4999, 9.4999) in 1 - saturated_share of samples."""
    x = rng.uniform(-2, 2, size=(samples, units)).astype(np.float32)
    for u, share in saturated_share.items():
        k = int(round(share * samples))
        x[rng.permutation(samples)[:k], u] = 12.0
    return x


def classes(labels, predictions, steps_from=0):
    t = Trial()
    for i, (lab, pred) in enumerate(zip(labels, predictions)):
        t.save(steps_from + i, {"labels": np.asarray(lab, np.int64)}, "labels")
        t.save(steps_from + i, {"predictions": np.asarray(pred, np.int64)}, "predictions")
    return t


def images(means: list[tuple[float, float, float]], n=4, name="hybridsequential0_input_0"):
    t = Trial()
    for step, m in enumerate(means):
        x = rng.normal(scale=0.3, size=(n, 3, 4, 4))
        x = x - x.mean(axis=(0, 2, 3), keepdims=True) + np.asarray(m)[None, :, None, None]
        t.save(step, {name: f32(x)}, "input_image")
    return t


def tokens(shares: dict[int, float], steps=4, n=5, length=20, name="embedding0_input_0"):
    t = Trial()
    for step in range(steps):
        ids = rng.integers(2, 100, size=n * length)
        start = 0
        for token, share in shares.items():
            k = int(round(share * ids.size))
            ids[start : start + k] = token
            start += k
        t.save(
            step, {name: rng.permutation(ids).reshape(n, length).astype(np.int64)}, "input_sequence"
        )
    return t


def importances(per_step: list[list[float]]):
    t = Trial()
    for step, values in enumerate(per_step):
        named = {f"feature_importance/weight/f{i}": f32([v]) for i, v in enumerate(values)}
        t.save(step, named, "feature_importance")
    return t


def steady(start=1.0, factor=0.8):
    return [start * factor**i for i in range(12)]


_overfit_alternating = Trial()
_named_images = images([(0, 0, 0), (0, 0, 0), (1.2, 1.2, 1.2), (1.2, 1.2, 1.2)], name="Net_input_0")
_named_images.regex["input_image"] = [".*Net_input_0"]  # the job's CollectionConfig

CASES: dict[str, dict[str, tuple[dict, str, Trial]]] = {
    "VanishingGradient": {
        "fire-at-3": ({"threshold": 1e-4}, "fires", grads([1e-2, 1e-2, 1e-2, 1e-5, 1e-5])),
        "fire-on-algo-2": (
            {"threshold": 1e-4},
            "fires",
            grads([1e-2] * 5, ("worker_0", "algo-2"), bad_worker="algo-2", bad_from=2),
        ),
        "quiet-above-threshold": ({"threshold": 1e-4}, "quiet", grads([5e-4] * 5)),
        "quiet-small-weights": ({"threshold": 1e-2}, "quiet", grads([5e-2] * 5)),
    },
    "ExplodingTensor": {
        "fire-nan-at-2": (
            {"only_nan": "True", "collection_names": "gradients"},
            "fires",
            with_value({2: np.nan}, "gradients", "gradient/fc1.weight"),
        ),
        "fire-inf-at-3": (
            {"only_nan": "False", "collection_names": "weights"},
            "fires",
            with_value({3: np.inf}, "weights", "fc2.weight"),
        ),
        "quiet-inf-only-nan": (
            {"only_nan": "True", "collection_names": "gradients"},
            "quiet",
            with_value({2: np.inf}, "gradients", "gradient/fc1.weight"),
        ),
        "quiet-nan-other-collection": (
            {"collection_names": "gradients"},
            "quiet",
            with_value({1: np.nan}, "weights", "fc2.weight"),
        ),
    },
    "LossNotDecreasing": {
        "fire-train-plateau": (
            {"num_steps": 4, "diff_percent": 5},
            "fires",
            losses(steady()[:6] + [steady()[5] * 0.99] * 10, train_every=2),
        ),
        "fire-eval-plateau": (
            {"num_steps": 4, "diff_percent": 5},
            "fires",
            losses(
                steady(),
                [1.0, 0.8, 0.7, 0.69, 0.69, 0.69],
                train_every=2,
                eval_at=(3, 7, 11, 15, 19, 23),
            ),
        ),
        "quiet-eval-decreasing-train-noisy": (
            {"num_steps": 4, "diff_percent": 5},
            "quiet",
            losses(
                [1.0, 0.7, 0.95, 0.6, 0.9, 0.62, 0.88, 0.6, 0.9, 0.61, 0.85, 0.6],
                [1.0, 0.8, 0.6, 0.45, 0.35, 0.25],
                train_every=2,
                eval_at=(3, 7, 11, 15, 19, 23),
            ),
        ),
        "quiet-steady": ({"num_steps": 4, "diff_percent": 5}, "quiet", losses(steady())),
        "sagemaker-2019-test": (
            {"num_steps": 10, "diff_percent": 0},
            "fires",
            losses([0.30, 0.33, 0.31, 0.30, 0.28], train_every=4),
        ),
    },
    "Overfit": {
        "fire-after-patience": (
            {"ratio_threshold": 0.25, "patience": 2},
            "fires",
            losses([1.0] * 8, [1.1, 1.2, 1.4, 1.4], train_every=2, eval_at=(1, 5, 9, 13)),
        ),
        "fire-from-start-step": (
            {"ratio_threshold": 0.25, "patience": 1, "start_step": 5},
            "fires",
            losses([1.0] * 8, [1.5, 1.5, 1.1, 1.5], train_every=2, eval_at=(1, 5, 9, 13)),
        ),
        "quiet-below-ratio": (
            {"ratio_threshold": 0.25, "patience": 1},
            "quiet",
            losses([1.0] * 8, [1.1, 1.2, 1.2, 1.2], train_every=2, eval_at=(1, 5, 9, 13)),
        ),
        "quiet-never-in-a-row": (
            {"ratio_threshold": 0.25, "patience": 2},
            "quiet",
            _overfit_alternating,
        ),
    },
    "Overtraining": {
        "fire-train-stalls": (
            {"patience_train": 3, "patience_validation": 20, "delta": 0.05},
            "fires",
            losses([1.0, 0.9, 0.8, 0.79, 0.78, 0.77, 0.76, 0.75]),
        ),
        "fire-eval-stalls": (
            {"patience_train": 20, "patience_validation": 2, "delta": 0.05},
            "fires",
            losses(steady(), [1.0, 0.7, 0.68, 0.67, 0.66], train_every=2, eval_at=(1, 3, 5, 7, 9)),
        ),
        "quiet-improving": (
            {"patience_train": 3, "patience_validation": 3, "delta": 0.05},
            "quiet",
            losses([1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]),
        ),
        "quiet-short-stall": (
            {"patience_train": 3, "patience_validation": 3, "delta": 0.05},
            "quiet",
            losses([1.0, 0.9, 0.89, 0.88, 0.7, 0.69, 0.68, 0.5]),
        ),
    },
    "AllZero": {
        "fire-70pct-at-2": (
            {"threshold": 60, "collection_names": "weights"},
            "fires",
            with_value({}, "weights", "fc2.weight", base=lambda s: zeros(0.7 if s >= 2 else 0.1)),
        ),
        "fire-all-zero-at-3": (
            {"threshold": 90, "collection_names": "gradients"},
            "fires",
            with_value(
                {}, "gradients", "gradient/fc2.weight", base=lambda s: zeros(1.0 if s >= 3 else 0)
            ),
        ),
        "quiet-50pct": (
            {"threshold": 60, "collection_names": "weights"},
            "quiet",
            with_value({}, "weights", "fc2.weight", base=lambda s: zeros(0.5)),
        ),
        "quiet-other-collection": (
            {"threshold": 60, "collection_names": "weights"},
            "quiet",
            with_value({}, "gradients", "gradient/fc2.weight", base=lambda s: zeros(1.0)),
        ),
    },
    "TensorVariance": {
        "fire-max-at-3": (
            {"max_threshold": 4, "min_threshold": 0.01, "collection_names": "weights"},
            "fires",
            with_value(
                {}, "weights", "fc2.weight", base=lambda s: with_variance(9 if s >= 3 else 1)
            ),
        ),
        "fire-min-at-2": (
            {"max_threshold": 4, "min_threshold": 0.01, "collection_names": "weights"},
            "fires",
            with_value(
                {}, "weights", "fc2.weight", base=lambda s: with_variance(1e-3 if s == 2 else 1)
            ),
        ),
        "quiet-between": (
            {"max_threshold": 4, "min_threshold": 0.01, "collection_names": "weights"},
            "quiet",
            with_value({}, "weights", "fc2.weight", base=lambda s: with_variance(0.5 + s / 2)),
        ),
        "quiet-other-collection": (
            {"max_threshold": 4, "collection_names": "weights"},
            "quiet",
            with_value({}, "gradients", "gradient/fc2.weight", base=lambda s: with_variance(9)),
        ),
    },
}

# Overfit alternating: above the ratio at every other invocation at most.
for _i in range(12):  # train 1.0, eval 1.5, train 1.3, eval 1.0, ...
    _loss = f32([(1.0, 1.5, 1.3, 1.0)[_i % 4]])
    _mode = TRAIN if _i % 2 == 0 else EVAL
    _overfit_alternating.save(_i, {"CrossEntropyLoss_output_0": _loss}, "losses", _mode, _i // 2)


def _drift(relative: float, from_step: int = 0, steps: int = 5):
    base = scaled(0.5)

    def at(step: int) -> np.ndarray:
        return f32(base * (1 + relative) ** max(step - from_step, 0))

    return with_value({}, "weights", "fc2.weight", steps=steps, base=at)


def _held(change_until: int, steps: int = 5):
    base = scaled(0.5)

    def at(step: int) -> np.ndarray:
        return f32(base * (1 + 0.1 * min(step, change_until)))

    return with_value({}, "weights", "fc2.weight", steps=steps, base=at)


def _updates(ratios: list[float]):
    w = scaled(0.5)
    t = Trial()
    for step, ratio in enumerate([0.0] + ratios):
        if step:
            d = rng.normal(size=w.shape)
            w = f32(w + d / np.linalg.norm(d) * ratio * np.linalg.norm(w))
        t.save(step, {"fc2.weight": w}, "weights")
    return t


def _relu_trial(per_step: list[dict[int, float]], name="layer1_relu_output"):
    t = Trial()
    for step, shares in enumerate(per_step):
        t.save(step, {name: relu(shares)}, "relu_output")
    return t


def _tanh_trial(per_step: list[dict[int, float]]):
    t = Trial()
    for step, shares in enumerate(per_step):
        t.save(step, {"layer1_tanh_input": tanh_in(shares)}, "tanh_input")
    return t


DEAD = {u: 0.05 for u in range(5)}  # five of ten units positive in 5 % of samples
CASES.update(
    {
        "UnchangedTensor": {
            "fire-held-after-2": (
                {"num_steps": 2, "rtol": 1e-3, "atol": 0, "collection_names": "weights"},
                "fires",
                _held(2),
            ),
            "fire-within-rtol": (
                {"num_steps": 3, "rtol": 1e-3, "atol": 0, "collection_names": "weights"},
                "fires",
                _drift(1e-4),
            ),
            "quiet-beyond-rtol": (
                {"num_steps": 2, "rtol": 1e-3, "atol": 0, "collection_names": "weights"},
                "quiet",
                _drift(2e-3),
            ),
            "quiet-held-too-briefly": (
                {"num_steps": 3, "rtol": 1e-3, "atol": 0, "collection_names": "weights"},
                "quiet",
                _held(3, steps=5),
            ),
        },
        "WeightUpdateRatio": {
            "fire-large-at-3": (
                {"large_threshold": 0.5, "small_threshold": 1e-4},
                "fires",
                _updates([0.01, 0.02, 0.9, 0.01]),
            ),
            "fire-small-at-2": (
                {"large_threshold": 0.5, "small_threshold": 1e-4},
                "fires",
                _updates([0.01, 1e-6, 0.01]),
            ),
            "quiet-moderate": (
                {"large_threshold": 0.5, "small_threshold": 1e-4},
                "quiet",
                _updates([0.01, 0.05, 0.1, 0.2]),
            ),
            "quiet-under-large": (
                {"large_threshold": 2, "small_threshold": 1e-4},
                "quiet",
                _updates([0.01, 0.9, 1.5, 0.01]),
            ),
        },
        "DeadRelu": {
            "fire-at-2": (
                {"threshold_inactivity": 10, "threshold_layer": 40},
                "fires",
                _relu_trial([{}, {}, DEAD, DEAD]),
            ),
            "fire-rarely-active": (
                {"threshold_inactivity": 10, "threshold_layer": 40},
                "fires",
                _relu_trial([{}, {u: 0.05 for u in range(6)}, {}]),
            ),
            "quiet-too-few-dead": (
                {"threshold_inactivity": 10, "threshold_layer": 40},
                "quiet",
                _relu_trial([{}, {u: 0.0 for u in range(3)}, {}]),
            ),
            "quiet-active-enough": (
                {"threshold_inactivity": 10, "threshold_layer": 40},
                "quiet",
                _relu_trial([{}, {u: 0.15 for u in range(8)}, {}]),
            ),
        },
        "SaturatedActivation": {
            "fire-at-2": (
                {"threshold_inactivity": 10, "threshold_layer": 40},
                "fires",
                _tanh_trial([{}, {}, {u: 0.95 for u in range(5)}]),
            ),
            "fire-at-1": (
                {"threshold_inactivity": 10, "threshold_layer": 20},
                "fires",
                _tanh_trial([{}, {u: 1.0 for u in range(3)}, {}]),
            ),
            "quiet-too-few": (
                {"threshold_inactivity": 10, "threshold_layer": 40},
                "quiet",
                _tanh_trial([{}, {u: 1.0 for u in range(3)}, {}]),
            ),
            "quiet-inside-enough": (
                {"threshold_inactivity": 10, "threshold_layer": 40},
                "quiet",
                _tanh_trial([{}, {u: 0.85 for u in range(8)}, {}]),
            ),
        },
        "ClassImbalance": {
            "fire-imbalance-at-1": (
                {"threshold_imbalance": 3, "threshold_misprediction": 0.9, "samples": 40},
                "fires",
                classes([[0] * 16 + [1] * 4] * 3, [[0] * 16 + [1] * 4] * 3),
            ),
            "fire-mispredicted-at-1": (
                {"threshold_imbalance": 10, "threshold_misprediction": 0.5, "samples": 40},
                "fires",
                classes([[0] * 10 + [1] * 10] * 3, [[0] * 10 + [0] * 6 + [1] * 4] * 3),
            ),
            "quiet-balanced": (
                {"threshold_imbalance": 3, "threshold_misprediction": 0.5, "samples": 40},
                "quiet",
                classes([[0] * 10 + [1] * 10] * 3, [[0] * 10 + [1] * 10] * 3),
            ),
            "quiet-too-few-samples": (
                {"threshold_imbalance": 3, "threshold_misprediction": 0.5, "samples": 100},
                "quiet",
                classes([[0] * 16 + [1] * 4] * 3, [[0] * 16 + [1] * 4] * 3),
            ),
        },
        "Confusion": {
            "fire-at-2": (
                {"min_diag": 0.7, "max_off_diag": 0.3},
                "fires",
                classes(
                    [[0, 1, 2] * 4] * 3,
                    [[0, 1, 2] * 4, [0, 1, 2] * 4, [1, 1, 2] * 4],
                ),
            ),
            "fire-at-0": (
                {"min_diag": 0.95, "max_off_diag": 0.3},
                "fires",
                classes([[0, 1] * 10] * 2, [[0, 1] * 9 + [1, 1]] * 2),
            ),
            "quiet-perfect": (
                {"min_diag": 0.7, "max_off_diag": 0.3},
                "quiet",
                classes([[0, 1, 2] * 4] * 3, [[0, 1, 2] * 4] * 3),
            ),
            "quiet-within-bounds": (
                {"min_diag": 0.8, "max_off_diag": 0.2},
                "quiet",
                classes([[0, 1] * 10] * 3, [[0, 1] * 9 + [1, 1]] * 3),
            ),
        },
        "CheckInputImages": {
            "fire-at-1": (
                {"threshold_mean": 0.5, "threshold_samples": 8},
                "fires",
                images([(0.8, 0.0, 0.0)] * 3),
            ),
            "fire-pytorch-name-at-3": (
                {"threshold_mean": 0.5, "threshold_samples": 8, "regex": ".*Net_input_0"},
                "fires",
                _named_images,
            ),
            "quiet-normalised": (
                {"threshold_mean": 0.5, "threshold_samples": 8},
                "quiet",
                images([(0.1, -0.1, 0.2)] * 3),
            ),
            "quiet-too-few-images": (
                {"threshold_mean": 0.5, "threshold_samples": 16},
                "quiet",
                images([(0.8, 0.0, 0.0)] * 3),
            ),
        },
        "NLPSequenceRatio": {
            "fire-token-0": (
                {"token_values": "0,1", "token_thresholds_percent": "30,20"},
                "fires",
                tokens({0: 0.4, 1: 0.1}),
            ),
            "fire-token-1": (
                {"token_values": "0,1", "token_thresholds_percent": "30,20"},
                "fires",
                tokens({0: 0.1, 1: 0.25}),
            ),
            "quiet-below": (
                {"token_values": "0,1", "token_thresholds_percent": "30,20"},
                "quiet",
                tokens({0: 0.2, 1: 0.1}),
            ),
            "quiet-other-token": (
                {"token_values": "0,1", "token_thresholds_percent": "30,20"},
                "quiet",
                tokens({5: 0.6}),
            ),
        },
        "FeatureImportanceOverweight": {
            "fire-at-0": (
                {"threshold": 0.6, "nfeatures": 2},
                "fires",
                importances([[50, 30, 10, 10]] * 3),
            ),
            "fire-at-2": (
                {"threshold": 0.6, "nfeatures": 2},
                "fires",
                importances([[25, 25, 25, 25], [30, 25, 25, 20], [50, 30, 10, 10]]),
            ),
            "quiet-even": (
                {"threshold": 0.6, "nfeatures": 2},
                "quiet",
                importances([[25, 25, 25, 25]] * 3),
            ),
            "quiet-just-below": (
                {"threshold": 0.6, "nfeatures": 3},
                "quiet",
                importances([[20, 20, 15, 15, 15, 15]] * 3),
            ),
        },
    }
)


def hook_trial(root: Path) -> None:
    """A tiny PyTorch model trained under smdebug's own PyTorch hook (smd.Hook), TRAIN then
    EVAL, saving every 2 steps: weights, gradients and losses as the hook names them. The
    learning rate falls to 0 after step 24, so the loss stops decreasing there."""
    import smdebug.pytorch as smd
    import torch

    torch.manual_seed(27)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    hook = smd.Hook(
        out_dir=str(root),
        save_config=smd.SaveConfig(save_interval=2),
        include_collections=["weights", "gradients", "losses"],
    )
    hook.register_module(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    hook.register_loss(loss_fn)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    x = torch.randn(64, 4)
    y = (x[:, 0] + x[:, 1] > 0).long()
    hook.set_mode(smd.modes.TRAIN)
    for step in range(40):
        for group in optimizer.param_groups:
            group["lr"] = 0.5 if step < 24 else 0.0
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    hook.set_mode(smd.modes.EVAL)
    with torch.no_grad():
        for _ in range(6):
            loss_fn(model(x), y)
    hook.close()


HOOK_CASES = {
    "LossNotDecreasing": [{"num_steps": 4, "diff_percent": 1}, {"num_steps": 8, "diff_percent": 0}],
    "VanishingGradient": [{"threshold": 1e-3}],
    "UnchangedTensor": [{"num_steps": 3, "rtol": 1e-6, "atol": 0, "collection_names": "weights"}],
    "WeightUpdateRatio": [{"large_threshold": 10, "small_threshold": 1e-6}],
}


def _stalled(gaps: dict[int, float], steps: int = 6) -> Trial:
    """Saves 10 s apart, but `gaps[step]` seconds after step `step`."""
    t = Trial()
    now = WALL
    for step in range(steps):
        t.save(step, {"fc1.weight": scaled(0.3)}, "weights")
        t.times[step] = now
        now += gaps.get(step, 10.0)
    return t


def _similar(diverge_from: int | None, relative: float, steps: int = 4) -> tuple[Trial, Trial]:
    """Two runs saving the same weights, until `diverge_from` where the second's differ."""
    one, two = Trial(), Trial()
    for step in range(steps):
        w = scaled(0.5)
        other = w if diverge_from is None or step < diverge_from else f32(w * (1 + relative))
        one.save(step, {"fc1.weight": w}, "weights")
        two.save(step, {"fc1.weight": other}, "weights")
    return one, two


def _poor_init(variances: list[tuple[float, float]], spread: list[float] | None = None):
    """Two ReLU layers' inputs with these variances per step, and a gradient per step whose
    5-95 percentile range is `spread[step]` (default: wide)."""
    t = Trial()
    for step, (v1, v2) in enumerate(variances):
        t.save(step, {"layer1_relu_input": with_variance(v1, (40, 8))}, "relu_input")
        t.save(step, {"layer2_relu_input": with_variance(v2, (40, 8))}, "relu_input")
        width = (spread or [])[step] if spread and step < len(spread) else 3.3
        g = rng.normal(size=(20, 20))
        g = g / (np.percentile(g, 95) - np.percentile(g, 5)) * width
        t.save(step, {"gradient/fc1.weight": f32(g)}, "gradients")
    return t


SIMILAR = {
    "fire-at-2": ({}, "fires", _similar(2, 0.05)),
    "fire-at-0": ({}, "fires", _similar(0, 0.5)),
    "quiet-identical": ({}, "quiet", _similar(None, 0.0)),
    "quiet-within-rtol": ({}, "quiet", _similar(1, 1e-7)),
}
CASES.update(
    {
        "StalledTrainingRule": {
            "fire-after-3": ({"threshold": 100}, "fires", _stalled({3: 200})),
            "fire-after-1": ({"threshold": 100}, "fires", _stalled({1: 150, 4: 300})),
            "quiet-short-gaps": ({"threshold": 100}, "quiet", _stalled({1: 90, 3: 95})),
            "quiet-larger-threshold": ({"threshold": 300}, "quiet", _stalled({3: 200})),
        },
        "PoorWeightInitialization": {
            "fire-variance-ratio-at-2": (
                {"threshold": 20, "distribution_range": 0.01, "steps": 4},
                "fires",
                _poor_init([(1, 2), (1, 3), (1, 50), (1, 50)]),
            ),
            "fire-narrow-gradient-at-1": (
                {"threshold": 20, "distribution_range": 0.01, "steps": 4},
                "fires",
                _poor_init([(1, 2)] * 4, [3.3, 0.005, 3.3, 3.3]),
            ),
            "quiet-ratio-under": (
                {"threshold": 20, "distribution_range": 0.01, "steps": 4},
                "quiet",
                _poor_init([(1, 15)] * 4),
            ),
            "quiet-after-its-steps": (
                {"threshold": 20, "distribution_range": 0.01, "steps": 4},
                "quiet",
                _poor_init([(1, 2)] * 6 + [(1, 50)]),
            ),
        },
    }
)


def main() -> int:
    if OUT.exists():
        shutil.rmtree(OUT)
    index = []
    for rule, cases in CASES.items():
        for case, (params, intent, trial) in cases.items():
            root = OUT / rule / case
            root.mkdir(parents=True)
            trial.write(root)
            (root / "smdebug-read.json").write_text(json.dumps(read_back(root)) + "\n")
            index.append({"rule": rule, "case": case, "parameters": params, "intent": intent})
    for case, (params, intent, (one, two)) in SIMILAR.items():
        for trial, root in (
            (one, OUT / "SimilarAcrossRuns" / case),
            (two, OUT / "SimilarAcrossRuns" / f"{case}.other"),
        ):
            root.mkdir(parents=True)
            trial.write(root)
            (root / "smdebug-read.json").write_text(json.dumps(read_back(root)) + "\n")
        index.append(
            {
                "rule": "SimilarAcrossRuns",
                "case": case,
                "intent": intent,
                "parameters": {**params, "other_trials": f"SimilarAcrossRuns/{case}.other"},
            }
        )
    root = OUT / "hook-pytorch"
    hook_trial(root)
    (root / "smdebug-read.json").write_text(json.dumps(read_back(root)) + "\n")
    for rule, variants in HOOK_CASES.items():
        for n, params in enumerate(variants):
            index.append(
                {
                    "rule": rule,
                    "case": f"hook-pytorch#{n}",
                    "trial": "hook-pytorch",
                    "parameters": params,
                    "intent": "measured",
                }
            )
    (OUT / "cases.json").write_text(json.dumps(index, indent=1) + "\n")
    print(f"wrote {len(index)} trials under {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

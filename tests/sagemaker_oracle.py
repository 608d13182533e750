"""SageMaker Debugger's tensor rules, as /work/shared/RULE-SEMANTICS.md section 4 describes them,
written here from that description alone (never from trainprof's code) for the agreement tests.

Input: what smdebug's own reader read from a trial (`smdebug-read.json`, written by
tests/fixtures_src/make_smdebug_trials.py with `smdebug.trials.create_trial`). A rule is invoked
at every saved global step, in order (`invoke_at_step`); `first_fired` is the first step at which
its condition holds, None if it never does. smdebug matches regexes anywhere in a name
(`re.search`).

The choices the description leaves open, taken here and named in the agreement table:
- LossNotDecreasing: the losses of one mode, EVAL if any was saved by then, else TRAIN, else
  GLOBAL, compared at that mode's steps; fires when `loss_s >= loss_prev * (1 - diff/100)`.
- Overfit: at each invocation from `start_step` (a global step), the latest validation and
  training losses; `patience` invocations in a row.
- Confusion: the labels and predictions saved at the invoked step.
- SimilarAcrossRuns: tensors of one name differ beyond numpy.allclose's default tolerances.
- StalledTrainingRule: the step saved before a silence longer than `threshold` (the events'
  wall times, as smdebug's FileReader reads them).
- PoorWeightInitialization: judged at the steps up to `steps`; a loss not improving by more
  than 0.01 for `patience` saves.
- ClassImbalance, CheckInputImages, NLPSequenceRatio: everything saved up to the step.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np


class View:
    """One trial as smdebug read it."""

    def __init__(self, path: Path):
        data = json.loads(Path(path).read_text())
        self.steps: list[int] = data["steps"]
        self.members: dict[str, set[str]] = {c: set(n) for c, n in data["collections"].items()}
        self.saves: list[dict] = []
        for t in data["tensors"]:
            value = np.array([float(v) if isinstance(v, str) else v for v in t["value"]])
            self.saves.append({**t, "value": value.reshape(t["shape"])})

    def at(self, step: int) -> list[dict]:
        return [t for t in self.saves if t["step"] == step]

    def upto(self, step: int) -> list[dict]:
        return [t for t in self.saves if t["step"] <= step]

    def collections_of(self, name: str) -> set[str]:
        return {c for c, names in self.members.items() if name in names}

    def chosen(self, tensors: list[dict], collections=(), regex=None) -> list[dict]:
        out = tensors
        if collections:
            out = [t for t in out if self.collections_of(t["name"]) & set(collections)]
        if regex:
            out = [t for t in out if re.search(regex, t["name"])]
        return out


def _names(value) -> tuple[str, ...]:
    if value in (None, "", "None"):
        return ()
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(value)


def _numbers(value) -> list[float]:
    return [float(v) for v in _names(str(value))] if not isinstance(value, list) else value


def _first(view: View, condition: Callable[[int], bool]) -> int | None:
    for step in view.steps:
        if condition(step):
            return step
    return None


# --- rules ----------------------------------------------------------------------------------


def vanishing_gradient(view: View, threshold=1e-7) -> int | None:
    return _first(
        view,
        lambda s: any(
            np.abs(t["value"]).mean() < float(threshold)
            for t in view.chosen(view.at(s), ["gradients"])
        ),
    )


def exploding_tensor(view: View, collection_names=(), tensor_regex=None, only_nan=False):
    only_nan = str(only_nan) == "True"

    def bad(t):
        v = t["value"].astype(float)
        return bool(np.isnan(v).any() if only_nan else (~np.isfinite(v)).any())

    return _first(
        view,
        lambda s: any(
            bad(t) for t in view.chosen(view.at(s), _names(collection_names), tensor_regex)
        ),
    )


def _mode_losses(view: View, step: int) -> list[dict]:
    """The losses LossNotDecreasing reads at `step`: one mode's, EVAL first."""
    losses = view.chosen(view.upto(step), ["losses"])
    for mode in ("EVAL", "TRAIN", "GLOBAL"):
        of_mode = [t for t in losses if t["mode"] == mode]
        if of_mode:
            return of_mode
    return []


def loss_not_decreasing(view: View, num_steps=10, diff_percent=0.1, mode=None, **_) -> int | None:
    n, diff = int(num_steps), float(diff_percent)
    last_evaluated: dict[str, int] = {}
    for step in view.steps:
        losses = _mode_losses(view, step)
        if mode:
            losses = [t for t in view.chosen(view.upto(step), ["losses"]) if t["mode"] == mode]
        current = [t for t in losses if t["step"] == step]
        if not current:
            continue
        m, loss = current[0]["mode_step"], float(current[0]["value"].mean())
        which = current[0]["mode"]
        if which in last_evaluated and m < last_evaluated[which] + n:
            continue
        earlier = [t for t in losses if t["mode_step"] <= m - n]
        if not earlier:
            continue
        base = float(max(earlier, key=lambda t: t["mode_step"])["value"].mean())
        last_evaluated[which] = m
        if loss >= base * (1 - diff / 100):
            return step
    return None


def _latest(losses: list[dict], mode: str) -> float | None:
    of_mode = [t for t in losses if t["mode"] == mode]
    return float(max(of_mode, key=lambda t: t["step"])["value"].mean()) if of_mode else None


def overfit(view: View, start_step=0, patience=1, ratio_threshold=0.1, **_) -> int | None:
    run = 0
    for step in view.steps:
        if step < int(start_step):
            continue
        losses = view.chosen(view.upto(step), ["losses"])
        train, valid = _latest(losses, "TRAIN"), _latest(losses, "EVAL")
        if train is None or valid is None:
            continue
        run = run + 1 if (valid - train) / abs(train) > float(ratio_threshold) else 0
        if run >= int(patience):
            return step
    return None


def overtraining(view: View, patience_train=5, patience_validation=10, delta=0.01) -> int | None:
    patience = {"TRAIN": int(patience_train), "EVAL": int(patience_validation)}
    best: dict[str, float] = {}
    since: dict[str, int] = {}
    for step in view.steps:
        for t in view.chosen(view.at(step), ["losses"]):
            mode, loss = t["mode"], float(t["value"].mean())
            if mode not in patience:
                continue
            if mode not in best or loss < best[mode] - float(delta):
                best[mode], since[mode] = loss, 0
            else:
                since[mode] += 1
            if since[mode] >= patience[mode]:
                return step
    return None


def all_zero(view: View, threshold=100, collection_names=(), tensor_regex=None) -> int | None:
    def zeros(t):
        return 100 * float((t["value"] == 0).mean()) >= float(threshold)

    return _first(
        view,
        lambda s: any(
            zeros(t) for t in view.chosen(view.at(s), _names(collection_names), tensor_regex)
        ),
    )


def tensor_variance(
    view: View, max_threshold=None, min_threshold=None, collection_names=(), tensor_regex=None
) -> int | None:
    def off(t):
        var = float(np.var(t["value"].astype(float)))
        return (max_threshold is not None and var > float(max_threshold)) or (
            min_threshold is not None and var < float(min_threshold)
        )

    return _first(
        view,
        lambda s: any(
            off(t) for t in view.chosen(view.at(s), _names(collection_names), tensor_regex)
        ),
    )


def _history(view: View, step: int, tensors: list[dict]) -> Iterator[list[dict]]:
    """Each tensor's saves up to `step`, oldest first, for the tensors saved at `step`."""
    for t in tensors:
        if t["step"] == step:
            yield [
                u for u in view.upto(step) if u["name"] == t["name"] and u["worker"] == t["worker"]
            ]


def unchanged_tensor(
    view: View, num_steps=3, rtol=1e-5, atol=1e-8, collection_names=(), tensor_regex=None, **_
) -> int | None:
    n = int(num_steps)

    def held(saves: list[dict]) -> bool:
        last = saves[-n:]
        return len(last) == n and all(
            np.allclose(b["value"], a["value"], rtol=float(rtol), atol=float(atol))
            for a, b in zip(last, last[1:])
        )

    def condition(s):
        tensors = view.chosen(view.upto(s), _names(collection_names), tensor_regex)
        return any(held(h) for h in _history(view, s, tensors))

    return _first(view, condition)


def weight_update_ratio(
    view: View, large_threshold=10, small_threshold=1e-8, epsilon=1e-9, **_
) -> int | None:
    def off(saves: list[dict]) -> bool:
        if len(saves) < 2:
            return False
        before, after = saves[-2]["value"].astype(float), saves[-1]["value"].astype(float)
        ratio = np.linalg.norm(after - before) / (np.linalg.norm(before) + float(epsilon))
        return ratio > float(large_threshold) or ratio < float(small_threshold)

    def condition(s):
        tensors = view.chosen(view.upto(s), ["weights"])
        return any(off(h) for h in _history(view, s, tensors))

    return _first(view, condition)


def _layer_share(x: np.ndarray, ok: np.ndarray, threshold_inactivity: float) -> float:
    """Percent of units (columns) for which `ok` holds in fewer than threshold % of samples."""
    share = ok.reshape(x.shape[0], -1).mean(axis=0)
    return 100 * float((share < threshold_inactivity / 100).mean())


def dead_relu(
    view: View, tensor_regex=".*relu_output", threshold_inactivity=1.0, threshold_layer=50.0
) -> int | None:
    def dead(t):
        x = t["value"]
        return _layer_share(x, x > 0, float(threshold_inactivity)) > float(threshold_layer)

    return _first(view, lambda s: any(dead(t) for t in view.chosen(view.at(s), (), tensor_regex)))


def saturated_activation(
    view: View,
    tensor_regex=".*tanh_input|.*sigmoid_input",
    threshold_tanh_min=-9.4999,
    threshold_tanh_max=9.4999,
    threshold_sigmoid_min=-23,
    threshold_sigmoid_max=16.99999,
    threshold_inactivity=1.0,
    threshold_layer=50.0,
) -> int | None:
    def saturated(t):
        x = t["value"]
        if "tanh" in t["name"]:
            low, high = float(threshold_tanh_min), float(threshold_tanh_max)
        else:
            low, high = float(threshold_sigmoid_min), float(threshold_sigmoid_max)
        inside = (x > low) & (x < high)
        return _layer_share(x, inside, float(threshold_inactivity)) > float(threshold_layer)

    return _first(
        view, lambda s: any(saturated(t) for t in view.chosen(view.at(s), (), tensor_regex))
    )


def _pairs(view: View, tensors: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    labels = [t for t in tensors if re.search(r".*labels", t["name"])]
    predictions = [t for t in tensors if re.search(r".*predictions", t["name"])]
    lab = np.concatenate([t["value"].reshape(-1) for t in labels]) if labels else np.array([])
    pred = (
        np.concatenate([t["value"].reshape(-1) for t in predictions])
        if predictions
        else np.array([])
    )
    return lab.astype(int), pred.astype(int)


def class_imbalance(
    view: View, threshold_imbalance=10, threshold_misprediction=0.7, samples=500, **_
) -> int | None:
    def condition(s):
        lab, pred = _pairs(view, view.upto(s))
        if lab.size < int(samples):
            return False
        counts = {c: int((lab == c).sum()) for c in np.unique(lab)}
        if max(counts.values()) / min(counts.values()) > float(threshold_imbalance):
            return True
        return any(
            float((pred[lab == c] != c).mean()) > float(threshold_misprediction) for c in counts
        )

    return _first(view, condition)


def confusion(view: View, min_diag=0.9, max_off_diag=0.1, **_) -> int | None:
    def condition(s):
        lab, pred = _pairs(view, view.at(s))
        if not lab.size:
            return False
        k = int(max(lab.max(), pred.max())) + 1
        m = np.zeros((k, k))
        for a, b in zip(lab, pred):
            m[a, b] += 1
        for i in range(k):
            column = m[:, i].sum()
            if not column:
                continue
            if m[i, i] / column < float(min_diag):
                return True
            if any(m[j, i] / column > float(max_off_diag) for j in range(k) if j != i):
                return True
        return False

    return _first(view, condition)


def check_input_images(
    view: View,
    threshold_mean=0.2,
    threshold_samples=500,
    regex=".*hybridsequential0_input_0",
    channel=1,
) -> int | None:
    def condition(s):
        tensors = [
            t
            for t in view.upto(s)
            if "input_image" in view.collections_of(t["name"]) or re.search(regex, t["name"])
        ]
        if not tensors or sum(t["value"].shape[0] for t in tensors) < int(threshold_samples):
            return False
        axis = int(channel)
        stacked = np.concatenate([np.moveaxis(t["value"], axis, 1) for t in tensors])
        means = stacked.reshape(stacked.shape[0], stacked.shape[1], -1).mean(axis=(0, 2))
        return bool((np.abs(means) > float(threshold_mean)).any())

    return _first(view, condition)


def nlp_sequence_ratio(
    view: View,
    tokens_regex=".*embedding0_input_0",
    token_values="0",
    token_thresholds_percent="50",
) -> int | None:
    values, thresholds = _numbers(token_values), _numbers(token_thresholds_percent)

    def condition(s):
        tensors = [
            t
            for t in view.upto(s)
            if "input_sequence" in view.collections_of(t["name"])
            or re.search(tokens_regex, t["name"])
        ]
        if not tensors:
            return False
        ids = np.concatenate([t["value"].reshape(-1) for t in tensors])
        return any(100 * float((ids == v).mean()) > p for v, p in zip(values, thresholds))

    return _first(view, condition)


def feature_importance_overweight(view: View, threshold=0.8, nfeatures=3, **_) -> int | None:
    def condition(s):
        tensors = [t for t in view.at(s) if "feature_importance" in view.collections_of(t["name"])]
        values = sorted((float(t["value"].sum()) for t in tensors), reverse=True)
        total = sum(values)
        return bool(total) and sum(values[: int(nfeatures)]) / total > float(threshold)

    return _first(view, condition)


def stalled_training_rule(view: View, threshold=1800, **_) -> int | None:
    """No new tensor written for `threshold` seconds: the step saved before the silence."""
    when = {s: max(t["wall_time"] for t in view.at(s)) for s in view.steps}
    for before, after in zip(view.steps, view.steps[1:]):
        if when[after] - when[before] > float(threshold):
            return before
    return None


def similar_across_runs(
    view: View, other_trials: str, collection_names=(), tensor_regex=None, **_
) -> int | None:
    """The two runs' tensors of one name differ at a step both saved (numpy.allclose's
    default tolerances)."""
    other = View(Path(other_trials) / "smdebug-read.json")

    def differ(s):
        theirs = {t["name"]: t["value"] for t in other.at(s)}
        return any(
            t["name"] in theirs
            and not np.allclose(t["value"], theirs[t["name"]], rtol=1e-5, atol=1e-8)
            for t in view.chosen(view.at(s), _names(collection_names), tensor_regex)
        )

    return _first(view, lambda s: s in other.steps and differ(s))


def poor_weight_initialization(
    view: View,
    activation_inputs_regex=".*relu_input|.*tanh_input|.*sigmoid_input",
    threshold=10.0,
    distribution_range=0.001,
    patience=5,
    steps=10,
) -> int | None:
    best, since = None, 0
    for s in view.steps:
        for t in view.chosen(view.at(s), ["losses"]):
            loss = float(t["value"].mean())
            if best is None or loss < best - 0.01:
                best, since = loss, 0
            else:
                since += 1
        if s > int(steps):
            continue
        inputs = [t for t in view.at(s) if re.search(activation_inputs_regex, t["name"])]
        variances = [float(np.var(t["value"])) for t in inputs]
        if len(variances) > 1 and max(variances) / min(variances) > float(threshold):
            return s
        for g in view.chosen(view.at(s), ["gradients"]):
            low, high = np.percentile(g["value"].astype(float), [5, 95])
            if high - low < float(distribution_range):
                return s
        if since >= int(patience):
            return s
    return None


RULES: dict[str, Callable[..., int | None]] = {
    "StalledTrainingRule": stalled_training_rule,
    "SimilarAcrossRuns": similar_across_runs,
    "PoorWeightInitialization": poor_weight_initialization,
    "VanishingGradient": vanishing_gradient,
    "ExplodingTensor": exploding_tensor,
    "LossNotDecreasing": loss_not_decreasing,
    "Overfit": overfit,
    "Overtraining": overtraining,
    "AllZero": all_zero,
    "TensorVariance": tensor_variance,
    "UnchangedTensor": unchanged_tensor,
    "WeightUpdateRatio": weight_update_ratio,
    "DeadRelu": dead_relu,
    "SaturatedActivation": saturated_activation,
    "ClassImbalance": class_imbalance,
    "Confusion": confusion,
    "CheckInputImages": check_input_images,
    "NLPSequenceRatio": nlp_sequence_ratio,
    "FeatureImportanceOverweight": feature_importance_overweight,
}


def first_fired(rule: str, trial: Path, parameters: dict) -> int | None:
    return RULES[rule](View(Path(trial) / "smdebug-read.json"), **parameters)

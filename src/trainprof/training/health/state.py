"""From saved reductions to the training-health series: the one reduction-to-metrics path.

`trainprof.torch.watch` (live) and `trainprof replay` of a SageMaker Debugger trial both reduce
tensors with `trainprof.training.health.reductions` and fold the results into a `HealthState`, so
the tensor rules see the same series either way. Plain Python floats only: no torch, no clocks.

    >>> state = HealthState()
    >>> for step, loss in [(0, .30), (4, .33), (8, .31), (12, .30), (16, .28)]:
    ...     state.observe_loss("train", step, loss)
    >>> state.value("trainprof_training_loss_evaluated", mode="train", num_steps="10")
    0.3
    >>> state.value("trainprof_training_loss_baseline", mode="train", num_steps="10")
    0.3
    >>> state.losses["train"].evaluations[10].step
    12

Cardinality: each tensor reduction is published per collection as its smallest and largest
value over the collection's tensors (`aggregate="min"` / `"max"`), and per tensor only for
tensors the caller marks as included (`include_regex`), at most `MAX_TENSOR_SERIES` of them;
the included tensors beyond the cap are counted in `trainprof_tensor_series_cut`.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import Metric as MetricFamily

from trainprof.contract import metrics as contract
from trainprof.contract.metrics import threshold_label
from trainprof.contract.sampling import Families, sample_value

# Reduction name -> the gauge it is published as. `allclose` is not published itself: it
# extends or resets the tensor's run of unchanged saves.
TENSOR_GAUGES = {
    "mean_abs": contract.TENSOR_MEAN_ABS,
    "nan": contract.TENSOR_NAN_VALUES,
    "inf": contract.TENSOR_INF_VALUES,
    "zero_ratio": contract.TENSOR_ZERO_RATIO,
    "variance": contract.TENSOR_VARIANCE,
    "l1": contract.TENSOR_L1_NORM,
    "l2": contract.TENSOR_L2_NORM,
    "update_ratio": contract.TENSOR_UPDATE_RATIO,
    "unchanged": contract.TENSOR_UNCHANGED_SAVES,
    "dead_ratio": contract.TENSOR_DEAD_UNIT_RATIO,
    "saturated_ratio": contract.TENSOR_SATURATED_UNIT_RATIO,
    "spread": contract.TENSOR_PERCENTILE_SPREAD,
}
OTHER_CLASS = "other"
TOP_FEATURES = 10


@dataclasses.dataclass
class Evaluation:
    """One LossNotDecreasing evaluation: the loss at `step` and the baseline it is compared to."""

    step: int
    loss: float
    baseline_step: int
    baseline: float


class LossHistory:
    """One mode's saved losses, evaluated as SageMaker's LossNotDecreasing and Overtraining.

    LossNotDecreasing (per `num_steps` n): at a saved step s, if no evaluation happened yet or
    s is at least n steps after the previous one, and some loss was saved at a step <= s - n,
    the newest such loss becomes the baseline of an evaluation at s. Overtraining: saves since
    the best loss last improved by more than `delta`.
    """

    def __init__(self, num_steps: Iterable[int], delta: float):
        self.num_steps = tuple(sorted({int(n) for n in num_steps}))
        self.delta = delta
        self.saved: list[tuple[int, float]] = []
        self.evaluations: dict[int, Evaluation] = {}
        self.latest: tuple[int, float] | None = None
        self.best: float | None = None
        self.since_best = 0

    def observe(self, step: int, loss: float) -> bool:
        """False when `step` is not a new save (saved twice, or out of order)."""
        if self.latest is not None and step <= self.latest[0]:
            return False
        for n in self.num_steps:
            previous = self.evaluations.get(n)
            if previous is not None and step < previous.step + n:
                continue
            base = self._newest_at_or_before(step - n)
            if base is not None:
                self.evaluations[n] = Evaluation(step, loss, base[0], base[1])
        self.saved.append((step, loss))
        self.latest = (step, loss)
        if self.best is None or loss < self.best - self.delta:
            self.best, self.since_best = loss, 0
        else:
            self.since_best += 1
        self._forget(step)
        return True

    def _newest_at_or_before(self, step: int) -> tuple[int, float] | None:
        for saved in reversed(self.saved):
            if saved[0] <= step:
                return saved
        return None

    def _forget(self, step: int) -> None:
        # Keep the newest save at or before step - max(n) and everything after it.
        horizon = step - (self.num_steps[-1] if self.num_steps else 0)
        keep = 0
        for i, (s, _) in enumerate(self.saved):
            if s <= horizon:
                keep = i
        if keep:
            del self.saved[:keep]


class HealthState:
    """Folds saved reductions, losses and counts into the training-health metric families.

    Not thread-safe: the live API serialises calls with the session's lock.
    """

    def __init__(
        self,
        *,
        loss_num_steps: Iterable[int] = contract.LOSS_NUM_STEPS,
        loss_delta: float = 0.01,
        token_values: Iterable[int] = (0,),
    ):
        self.loss_num_steps = tuple(loss_num_steps)
        self.loss_delta = loss_delta
        self.saves = 0
        self.last_save_step: int | None = None
        self.last_save_time: float | None = None
        self.tensors: dict[tuple[str, str], dict[str, float]] = {}
        self.included: set[tuple[str, str]] = set()
        self.cut: dict[str, set[str]] = {}
        self.losses: dict[str, LossHistory] = {}
        self.loss_steps: dict[str, int] = {}  # mode -> training step of its latest loss
        self.logged: dict[tuple[str, str], float] = {}
        self.confusion: dict[tuple[str, str], float] = {}
        self.saved_confusion: dict[tuple[str, str], float] = {}  # of the latest save
        self.classes_step: int | None = None
        self.input_samples = 0.0
        self.channel_sums: dict[int, float] = {}
        self.tokens = 0.0
        self.token_matches: dict[str, float] = {str(int(t)): 0.0 for t in token_values}
        self.feature_top: list[float] = []
        self.tree_depth: float | None = None

    def configure(
        self,
        *,
        loss_num_steps: Iterable[int],
        loss_delta: float,
        token_values: Iterable[int],
        **_process: float,
    ) -> None:
        """Compute with a rule configuration's settings from now on (losses already logged
        are kept; `_process`: what the watcher's hooks take, not this state)."""
        self.loss_num_steps = tuple(loss_num_steps)
        self.loss_delta = loss_delta
        for history in self.losses.values():
            history.num_steps = tuple(sorted({int(n) for n in self.loss_num_steps}))
            history.delta = loss_delta
        for token in token_values:
            self.token_matches.setdefault(str(int(token)), 0.0)

    # --- observations --------------------------------------------------------------------

    def observe_save(self, step: int, timestamp: float | None = None) -> None:
        """One save of the watched tensors at training step `step`."""
        self.saves += 1
        self.last_save_step = step
        if timestamp is not None:
            self.last_save_time = timestamp

    def observe_tensor(
        self, collection: str, tensor: str, values: Mapping[str, float], include: bool = False
    ) -> None:
        """A tensor's reductions at a save (keys of `TENSOR_GAUGES`, plus `allclose`)."""
        key = (collection, tensor)
        row = self.tensors.get(key)
        if row is None:
            row = self.tensors[key] = {}
            if include:
                if len(self.included) < contract.MAX_TENSOR_SERIES:
                    self.included.add(key)
                else:
                    self.cut.setdefault(collection, set()).add(tensor)
        for name, value in values.items():
            if name == "allclose":
                row["unchanged"] = row.get("unchanged", 0.0) + 1.0 if value else 0.0
            else:
                row[name] = float(value)
        if "mean_abs" in values and "allclose" not in values:
            row.setdefault("unchanged", 0.0)

    def observe_loss(
        self,
        mode: str,
        step: int,
        loss: float,
        timestamp: float | None = None,
        mode_step: int | None = None,
    ) -> None:
        """A loss saved at training step `step`; LossNotDecreasing compares losses
        `num_steps` apart in their mode's steps (`mode_step`, smdebug's; default `step`)."""
        history = self.losses.get(mode)
        if history is None:
            history = self.losses[mode] = LossHistory(self.loss_num_steps, self.loss_delta)
        if history.observe(step if mode_step is None else mode_step, float(loss)):
            self.loss_steps[mode] = step
        if timestamp is not None:
            self.last_save_time = timestamp

    def observe_metric(self, name: str, mode: str, value: float) -> bool:
        """A logged metric; False (not kept) beyond `MAX_LOGGED_METRICS` names."""
        key = (name, mode)
        if key not in self.logged and len({n for n, _ in self.logged} | {name}) > (
            contract.MAX_LOGGED_METRICS
        ):
            return False
        self.logged[key] = float(value)
        return True

    def observe_classes(
        self, pairs: Mapping[tuple[int, int], float], step: int | None = None
    ) -> None:
        """Counts of (true class, predicted class) among the samples saved at training step
        `step` (several calls for one step add up; None: a save of its own)."""
        if step is None or step != self.classes_step:
            self.saved_confusion = {}
        self.classes_step = step
        for (label, predicted), n in pairs.items():
            key = (_class_label(label), _class_label(predicted))
            self.confusion[key] = self.confusion.get(key, 0.0) + float(n)
            self.saved_confusion[key] = self.saved_confusion.get(key, 0.0) + float(n)

    def observe_inputs(self, samples: float, channel_sums: Mapping[int, float]) -> None:
        """Saved input samples and each channel's sum of per-sample means."""
        self.input_samples += samples
        for channel, total in channel_sums.items():
            if channel < contract.MAX_CHANNELS:
                self.channel_sums[channel] = self.channel_sums.get(channel, 0.0) + total

    def observe_tokens(self, total: float, matches: Mapping[int, float]) -> None:
        self.tokens += total
        for token, n in matches.items():
            key = str(int(token))
            if key in self.token_matches:
                self.token_matches[key] += n

    def observe_feature_importance(self, importances: Iterable[float]) -> None:
        ranked = sorted((float(v) for v in importances), reverse=True)
        total = sum(ranked)
        if total > 0:
            running, self.feature_top = 0.0, []
            for v in ranked[:TOP_FEATURES]:
                running += v
                self.feature_top.append(running / total)
            # Features without importance add nothing: the top n hold everything beyond.
            self.feature_top += [1.0] * (TOP_FEATURES - len(self.feature_top))

    def observe_tree_depth(self, depth: float) -> None:
        self.tree_depth = float(depth)

    def copy(self) -> HealthState:
        return copy.deepcopy(self)

    # --- rendering -----------------------------------------------------------------------

    def families(self, identity: Mapping[str, str] | None = None) -> Iterator[MetricFamily]:
        """The health families; those of features never used are left out."""
        identity = identity or {}
        ident_names = [k for k in contract.TRAINING_IDENTITY if k in identity]
        ident = [identity[k] for k in ident_names]
        fam = Families(ident_names)
        if self.saves:
            yield fam.counter(contract.TENSOR_SAVES_TOTAL, [], [(ident, self.saves)])
        yield from fam.known(contract.TENSOR_LAST_SAVE_STEP, ident, self.last_save_step)
        yield from fam.known(
            contract.TENSOR_LAST_SAVE_TIMESTAMP_SECONDS, ident, self.last_save_time
        )
        if self.tensors:
            yield from self._tensor_families(fam, ident)
        if self.losses:
            yield from self._loss_families(fam, ident)
        if self.logged:
            rows = [(ident + [n, m], v) for (n, m), v in sorted(self.logged.items())]
            yield fam.gauge(contract.TRAINING_METRIC, ["metric", "mode"], rows)
        if self.confusion:
            rows = [(ident + [a, b], n) for (a, b), n in sorted(self.confusion.items())]
            yield fam.counter(
                contract.CLASSIFICATION_SAMPLES_TOTAL, ["label_class", "predicted_class"], rows
            )
            rows = [(ident + [a, b], n) for (a, b), n in sorted(self.saved_confusion.items())]
            yield fam.gauge(
                contract.CLASSIFICATION_SAVED_SAMPLES, ["label_class", "predicted_class"], rows
            )
        if self.input_samples:
            yield fam.counter(contract.INPUT_SAMPLES_TOTAL, [], [(ident, self.input_samples)])
            rows = [
                (ident + [str(c)], s / self.input_samples)
                for c, s in sorted(self.channel_sums.items())
            ]
            yield fam.gauge(contract.INPUT_CHANNEL_MEAN, ["channel"], rows)
        if self.tokens:
            yield fam.counter(contract.INPUT_TOKENS_TOTAL, [], [(ident, self.tokens)])
            rows = [(ident + [t], n) for t, n in sorted(self.token_matches.items())]
            yield fam.counter(contract.INPUT_TOKEN_MATCHES_TOTAL, ["token"], rows)
        if self.feature_top:
            rows = [(ident + [str(i + 1)], v) for i, v in enumerate(self.feature_top)]
            yield fam.gauge(contract.XGBOOST_FEATURE_IMPORTANCE_TOP_RATIO, ["top"], rows)
        yield from fam.known(contract.XGBOOST_TREE_DEPTH, ident, self.tree_depth)

    def _tensor_families(self, fam: Families, ident: list[str]) -> Iterator[MetricFamily]:
        by_collection: dict[str, list[tuple[str, dict[str, float]]]] = {}
        for (collection, tensor), row in sorted(self.tensors.items()):
            by_collection.setdefault(collection, []).append((tensor, row))
        yield fam.gauge(
            contract.TENSOR_SERIES_CUT,
            ["collection"],
            [(ident + [c], len(self.cut.get(c, ()))) for c in by_collection],
        )
        labels = list(contract.metric(contract.TENSOR_MEAN_ABS).labels)
        for reduction, name in TENSOR_GAUGES.items():
            rows = []
            for collection, tensors in by_collection.items():
                values = [row[reduction] for _, row in tensors if reduction in row]
                finite = [v for v in values if not math.isnan(v)]
                if finite:
                    rows.append((ident + [collection, "", "min"], min(finite)))
                    rows.append((ident + [collection, "", "max"], max(finite)))
                for tensor, row in tensors:
                    if (collection, tensor) in self.included and reduction in row:
                        rows.append((ident + [collection, tensor, ""], row[reduction]))
            if rows:
                yield fam.gauge(name, labels, rows)

    def _loss_families(self, fam: Families, ident: list[str]) -> Iterator[MetricFamily]:
        modes = sorted(self.losses.items())
        latest = [(m, h.latest) for m, h in modes if h.latest is not None]
        yield fam.gauge(
            contract.TRAINING_LOSS, ["mode"], [(ident + [m], v) for m, (_, v) in latest]
        )
        yield fam.gauge(
            contract.TRAINING_LOSS_STEP,
            ["mode"],
            [(ident + [m], self.loss_steps.get(m, s)) for m, (s, _) in latest],
        )
        evaluations = [
            (m, threshold_label(n), e) for m, h in modes for n, e in sorted(h.evaluations.items())
        ]
        yield fam.gauge(
            contract.TRAINING_LOSS_EVALUATED,
            ["mode", "num_steps"],
            [(ident + [m, n], e.loss) for m, n, e in evaluations],
        )
        yield fam.gauge(
            contract.TRAINING_LOSS_BASELINE,
            ["mode", "num_steps"],
            [(ident + [m, n], e.baseline) for m, n, e in evaluations],
        )
        yield fam.gauge(
            contract.TRAINING_LOSS_SAVES_SINCE_IMPROVEMENT,
            ["mode"],
            [(ident + [m], h.since_best) for m, h in modes],
        )

    def value(self, name: str, **labels: str) -> float | None:
        """One sample's value by exposed sample name and labels (tests and debugging)."""
        return sample_value(self.families(), name, **labels)


def _class_label(value: int) -> str:
    value = int(value)
    return str(value) if 0 <= value < contract.MAX_CLASSES else OTHER_CLASS

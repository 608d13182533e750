"""SageMaker Debugger's tensor rules: the model's health rather than the machine's.

They read the reductions the training process publishes (`trainprof.torch.watch`,
`trainprof.log_loss`, the framework and XGBoost callbacks; `trainprof.training.health.state`): per
collection the smallest and largest value of each reduction over its tensors
(`aggregate="min"` / `"max"`), and per tensor only for tensors watched with `include_regex`.
SageMaker evaluated these rules at every saved step; here they are evaluated every
`scan_interval_us` on the latest save, so a condition that holds at a save is seen until
the next save replaces it (replay of a trial evaluates after every saved step and reports
`first_fired_step`).

Parameters the training process must know to compute a reduction (LossNotDecreasing's
`num_steps`, UnchangedTensor's `rtol`/`atol`, DeadRelu's `threshold_inactivity`, ...) are
this rule's `inputs`: pass the same configuration to `trainprof.torch.watch(rules_config=)`.
"""

from __future__ import annotations

import dataclasses
import re

from trainprof.rules import promql
from trainprof.rules.catalog._text import JOB
from trainprof.rules.model import (
    NUMBER_UNIT,
    RATIO_UNIT,
    SECONDS_UNIT,
    Alert,
    Build,
    Recordings,
    RuleOutput,
    RuleSpec,
    Selects,
    Signal,
    Threshold,
)
from trainprof.rules.params import MODE, PERCENT, param, scan_interval_param
from trainprof.rules.tensor_params import (
    FLAG,
    NAMES,
    NUMBER,
    NUMBERS,
    OPTIONAL_NUMBER,
    OPTIONAL_STEPS,
    REGEX,
    STEPS,
    TEXT,
    WHOLE,
)

_COLLECTIONS = "Collections to watch (comma-separated, smdebug's names); empty for all."
_TENSOR_REGEX = (
    "Only tensors matching this regex; they need their own series "
    "(trainprof.torch.watch(include_regex=...)); empty for every tensor."
)
_FAMILY = "health"


# --- selectors ----------------------------------------------------------------------------


def _tensor_sel(
    b: Build, series: str, aggregate: str, collections=(), tensor_regex=None, **equal: str
) -> str:
    """A tensor reduction: per-collection aggregates, or per-tensor rows for a regex."""
    b.sel(series)  # must be in the metric contract
    matchers = list(b.matchers)
    if collections:
        matchers.append(
            promql.Matcher("collection", "=~", "|".join(re.escape(c) for c in collections))
        )
    if tensor_regex:
        matchers.append(promql.Matcher("tensor", "=~", tensor_regex))
        aggregate = ""
    return promql.selector(series, matchers, aggregate=aggregate, **equal)


def _by_collection(b: Build) -> str:
    return promql.by(tuple(b.job_labels) + ("collection",))


def _warn_regex(b: Build, name: str, value: str | None) -> None:
    if value:
        b.warnings.append(
            f"{b.path(name)}: {b.rule.name} reads only tensors with their own series; pass "
            f"trainprof.torch.watch(include_regex=...) a regex covering {value!r}"
        )


def _signal(title: str, expr: str, unit: str, threshold: Threshold) -> Signal:
    return Signal(title, expr, "{{training_job}} {{collection}}{{mode}}", unit, threshold)


def _scope_sel(scope: Selects, series: str, **equal: str) -> str:
    return scope.sel(series, **equal)


# --- VanishingGradient ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class VanishingGradientParams:
    threshold: float = param(1e-7, NUMBER, "Mean |gradient| below which a gradient vanishes.")
    scan_interval_us: int = scan_interval_param()


def _vanishing(b: Build[VanishingGradientParams]) -> RuleOutput:
    grads = _tensor_sel(b, "trainprof_tensor_mean_abs", "min", ("gradients",))
    return RuleOutput(
        alerts=(
            Alert(
                expr=f"min {b.by_job} ({grads})\n< {b.p.threshold:g}",
                summary="Gradients have vanished.",
                description=(
                    f"Job {JOB}: the smallest mean |gradient| of a watched tensor is "
                    f"{{{{ $value }}}}, below {b.p.threshold:g}."
                ),
            ),
        )
    )


def _vanishing_signals(b, out, scope, _: Recordings):
    expr = f"min {scope.by_job} ({_scope_sel(scope, 'trainprof_tensor_mean_abs', collection='gradients', aggregate='min')})"  # noqa: E501
    return (
        _signal(
            "Smallest mean |gradient|",
            expr,
            NUMBER_UNIT,
            Threshold(b.p.threshold, f"threshold = {b.p.threshold:g}", "below"),
        ),
    )


VANISHING_GRADIENT = RuleSpec(
    name="VanishingGradient",
    summary="Gradients close to zero",
    detects=(
        "The mean absolute value of some gradient tensor below `threshold` at its latest "
        "save: the layers behind it stop learning."
    ),
    recommendation=(
        "Use ReLU-family activations, residual connections or normalisation layers, a "
        "better initialisation, or a larger learning rate for the affected layers."
    ),
    severity="warning",
    parameters=VanishingGradientParams,
    build=_vanishing,
    signals=_vanishing_signals,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "The mean |gradient| is computed on the device at each save by trainprof.torch.watch; "
        "the rule reads the smallest over the gradients collection, so it names the "
        "collection, not the tensor (watch with include_regex for per-tensor series)."
    ),
)


# --- ExplodingTensor ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ExplodingTensorParams:
    collection_names: tuple = param((), NAMES, _COLLECTIONS)
    tensor_regex: str | None = param(None, REGEX, _TENSOR_REGEX)
    only_nan: bool = param(False, FLAG, "Count NaN only, not infinities.")
    scan_interval_us: int = scan_interval_param()


def _exploding(b: Build[ExplodingTensorParams]) -> RuleOutput:
    p = b.p
    _warn_regex(b, "tensor_regex", p.tensor_regex)
    nan = _tensor_sel(b, "trainprof_tensor_nan_values", "max", p.collection_names, p.tensor_regex)
    bad = nan
    if not p.only_nan:
        inf = _tensor_sel(
            b, "trainprof_tensor_inf_values", "max", p.collection_names, p.tensor_regex
        )
        bad = f"{nan} + {inf}"
    loss = b.sel("trainprof_training_loss")
    loss_bad = f"{loss} != {loss}" if p.only_nan else f"({loss} != {loss}) or abs({loss}) == +Inf"
    expr = f"max {_by_collection(b)} ({bad}) > 0"
    if not p.collection_names and not p.tensor_regex:
        expr += f"\nor\ncount {b.by_job} ({loss_bad}) > 0"
    return RuleOutput(
        alerts=(
            Alert(
                expr=expr,
                summary="Tensors hold NaN or infinite values.",
                description=(
                    f"Job {JOB}: {{{{ $value }}}} non-finite value(s) in the latest save of "
                    "collection {{ $labels.collection }} (or in the loss)."
                ),
            ),
        )
    )


def _exploding_signals(b, out, scope, _):
    expr = (
        f"max {promql.by(('training_job', 'collection'))} "
        f"({scope.sel('trainprof_tensor_nan_values', aggregate='max')} + "
        f"{scope.sel('trainprof_tensor_inf_values', aggregate='max')})"
    )
    return (_signal("Non-finite values", expr, NUMBER_UNIT, Threshold(0, "any", "above")),)


EXPLODING_TENSOR = RuleSpec(
    name="ExplodingTensor",
    summary="NaN or infinite tensors",
    detects=(
        "A watched tensor (or the loss) holds NaN values, or infinities unless `only_nan`: "
        "training has diverged."
    ),
    recommendation=(
        "Lower the learning rate, clip gradients, check the inputs for NaN, and use a "
        "numerically stable loss (log-sum-exp, BCEWithLogits) or a loss scaler under AMP."
    ),
    severity="critical",
    parameters=ExplodingTensorParams,
    build=_exploding,
    signals=_exploding_signals,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "Reads NaN/Inf counts per collection (and the loss) instead of scanning every tensor; "
        "`tensor_regex` needs the tensors' own series (include_regex)."
    ),
)


# --- LossNotDecreasing ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LossNotDecreasingParams:
    tensor_regex: str | None = param(None, REGEX, "Ignored: losses come from log_loss().")
    use_losses_collection: bool = param(True, FLAG, "Ignored: losses come from log_loss().")
    num_steps: int = param(10, STEPS, "Steps between the two losses compared.")
    diff_percent: float = param(
        0.1, PERCENT, "Minimum percentage by which the loss must decrease over num_steps."
    )
    increase_threshold_percent: float = param(
        5, PERCENT, "Accepted, not used: any loss not decreasing enough already fires."
    )
    mode: str | None = param(None, MODE, "Only losses of this mode; empty for each mode.")
    scan_interval_us: int = scan_interval_param()


def _loss_not_decreasing(b: Build[LossNotDecreasingParams]) -> RuleOutput:
    p = b.p
    equal = {"num_steps": str(p.num_steps)}
    if p.mode:
        equal["mode"] = p.mode
    evaluated = b.sel("trainprof_training_loss_evaluated", **equal)
    baseline = b.sel("trainprof_training_loss_baseline", **equal)
    factor = 1 - p.diff_percent / 100
    return RuleOutput(
        alerts=(
            Alert(
                expr=f"{evaluated}\n>= {baseline} * {factor:.10g}",
                summary="The loss is not decreasing.",
                description=(
                    f"Job {JOB}, {{{{ $labels.mode }}}} loss: {{{{ $value }}}} at the latest "
                    f"evaluation did not fall by {p.diff_percent:g}% from the loss "
                    f"{p.num_steps} steps earlier."
                ),
            ),
        )
    )


def _loss_signals(b, out, scope, _):
    expr = scope.sel("trainprof_training_loss")
    return (_signal("Loss", expr, NUMBER_UNIT, Threshold(0, "previous loss", "above")),)


def _loss_inputs(b: Build[LossNotDecreasingParams]):
    if b.p.num_steps != 10:
        b.warnings.append(
            f"{b.path('num_steps')}: the training process evaluates num_steps 10 by "
            f"default; give trainprof.torch.watch(rules_config=...) this configuration so it "
            f"evaluates {b.p.num_steps} too"
        )
    return {"loss_num_steps": b.p.num_steps}


LOSS_NOT_DECREASING = RuleSpec(
    name="LossNotDecreasing",
    summary="Loss not decreasing",
    detects=(
        "Every `num_steps` steps, the latest saved loss compared with the newest loss saved "
        "at least `num_steps` steps earlier: fires when it did not fall by `diff_percent` %."
    ),
    recommendation=(
        "Check the learning rate (too small, or too large and oscillating), the data "
        "pipeline (shuffling, labels), and whether the model has already converged; stop "
        "the job if it no longer learns."
    ),
    severity="warning",
    parameters=LossNotDecreasingParams,
    build=_loss_not_decreasing,
    signals=_loss_signals,
    inputs=_loss_inputs,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "Reading of `diff_percent`: the documented one, fire when "
        "`loss_s >= loss_prev x (1 - diff_percent/100)`. SageMaker's 2019 test passed only "
        "with the opposite (`loss_s >= loss_prev x (1 + diff_percent/100)`); both agree at "
        "`diff_percent` 0. Without `mode`, each mode's losses are judged separately (the "
        "original picked one mode: eval, else train, else global). "
        "`increase_threshold_percent` is accepted and not used."
    ),
)


# --- Overfit ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OverfitParams:
    tensor_regex: str | None = param(None, REGEX, "Ignored: losses come from log_loss().")
    start_step: int = param(0, WHOLE, "Training step from which the rule decides.")
    patience: int = param(1, STEPS, "Evaluations the condition must hold in a row.")
    ratio_threshold: float = param(
        0.1, NUMBER, "(validation loss - training loss) / training loss above which it fires."
    )
    scan_interval_us: int = scan_interval_param()


def _overfit(b: Build[OverfitParams]) -> RuleOutput:
    p = b.p
    train = b.sel("trainprof_training_loss", mode="train")
    valid = b.sel("trainprof_training_loss", mode="eval")
    step = b.sel("trainprof_training_loss_step", mode="train")
    expr = (
        f"({valid} - ignoring (mode) {train})\n/ ignoring (mode) abs({train})\n"
        f"> {p.ratio_threshold:g}\nand ignoring (mode)\n{step} >= {p.start_step}"
    )
    return RuleOutput(
        alerts=(
            Alert(
                expr=expr,
                summary="Validation loss is well above training loss.",
                description=(
                    f"Job {JOB}: validation loss exceeds training loss by "
                    f"{{{{ $value | humanizePercentage }}}} (threshold {p.ratio_threshold:g})."
                ),
                for_seconds=(p.patience - 1) * p.scan_interval_us / 1e6,
            ),
        )
    )


def _overfit_signals(b, out, scope, _):
    expr = scope.sel("trainprof_training_loss")
    return (
        _signal(
            "Training and validation loss",
            expr,
            NUMBER_UNIT,
            Threshold(b.p.ratio_threshold, f"ratio_threshold = {b.p.ratio_threshold:g}", "above"),
        ),
    )


OVERFIT = RuleSpec(
    name="Overfit",
    summary="Overfitting",
    detects=(
        "The latest validation loss above the latest training loss by more than "
        "`ratio_threshold` of the training loss, from `start_step` on."
    ),
    recommendation=(
        "Add regularisation (dropout, weight decay, augmentation), get more data, or stop "
        "earlier (early stopping on the validation loss)."
    ),
    severity="warning",
    parameters=OverfitParams,
    build=_overfit,
    signals=_overfit_signals,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "Compares the latest saved loss of each mode (the original compared means over its "
        "evaluation window). `patience` becomes a `for:` of patience - 1 scan intervals."
    ),
)


# --- Overtraining ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OvertrainingParams:
    patience_train: int = param(5, STEPS, "Saved training losses without improvement.")
    patience_validation: int = param(10, STEPS, "Saved validation losses without improvement.")
    delta: float = param(0.01, NUMBER, "Minimum decrease of the best loss that counts.")
    scan_interval_us: int = scan_interval_param()


def _overtraining(b: Build[OvertrainingParams]) -> RuleOutput:
    p = b.p
    since = "trainprof_training_loss_saves_since_improvement"
    expr = (
        f"{b.sel(since, mode='train')} >= {p.patience_train}\n"
        f"or\n{b.sel(since, mode='eval')} >= {p.patience_validation}"
    )
    return RuleOutput(
        alerts=(
            Alert(
                expr=expr,
                summary="The loss stopped improving.",
                description=(
                    f"Job {JOB}: the {{{{ $labels.mode }}}} loss has not improved by more than "
                    f"{p.delta:g} for {{{{ $value }}}} saved steps."
                ),
            ),
        )
    )


def _overtraining_signals(b, out, scope, _):
    expr = scope.sel("trainprof_training_loss_saves_since_improvement")
    return (
        _signal(
            "Saves since the loss improved",
            expr,
            NUMBER_UNIT,
            Threshold(b.p.patience_train, f"patience_train = {b.p.patience_train}", "above"),
        ),
    )


def _overtraining_inputs(b: Build[OvertrainingParams]):
    if b.p.delta != 0.01:
        b.warnings.append(
            f"{b.path('delta')}: the training process counts improvements over 0.01 by "
            "default; give trainprof.torch.watch(rules_config=...) this configuration"
        )
    return {"loss_delta": b.p.delta}


OVERTRAINING = RuleSpec(
    name="Overtraining",
    summary="Loss stopped improving",
    detects=(
        "The training loss has not improved by more than `delta` for `patience_train` saved "
        "steps, or the validation loss for `patience_validation`."
    ),
    recommendation="Stop the job (early stopping), or lower the learning rate and continue.",
    severity="warning",
    parameters=OvertrainingParams,
    build=_overtraining,
    signals=_overtraining_signals,
    inputs=_overtraining_inputs,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "Counts saved losses (SageMaker's steps were its saved steps too); `delta` is applied "
        "by the training process, which must be given a non-default value "
        "(watch(rules_config=))."
    ),
)


# --- StalledTrainingRule -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StalledTrainingParams:
    threshold: float = param(1800, NUMBER, "Seconds without a new step or save.")
    stop_training_on_fire: bool = param(
        False, FLAG, "Stop the job when it fires (through the StopTraining receiver)."
    )
    training_job_name_prefix: str | None = param(None, TEXT, "Accepted, not used.")
    scan_interval_us: int = scan_interval_param()


def _stalled(b: Build[StalledTrainingParams]) -> RuleOutput:
    step = b.sel("trainprof_training_last_step_timestamp_seconds")
    save = b.sel("trainprof_tensor_last_save_timestamp_seconds")
    labels = {"action": "stop"} if b.p.stop_training_on_fire else {}
    return RuleOutput(
        alerts=(
            Alert(
                expr=(
                    f"time() - (max {b.by_job} ({step}) or max {b.by_job} ({save}))\n"
                    f"> {b.p.threshold:g}"
                ),
                summary="Training has stalled.",
                description=(
                    f"Job {JOB}: no step ended and no tensor was saved for "
                    "{{ $value | humanizeDuration }} "
                    f"(threshold {b.p.threshold:g} s)."
                ),
                labels=labels,
            ),
        )
    )


def _stalled_signals(b, out, scope, _):
    expr = f"time() - max {scope.by_job} ({scope.sel('trainprof_training_last_step_timestamp_seconds')})"  # noqa: E501
    return (
        _signal(
            "Seconds since the last step",
            expr,
            SECONDS_UNIT,
            Threshold(b.p.threshold, f"threshold = {b.p.threshold:g} s", "above"),
        ),
    )


STALLED_TRAINING = RuleSpec(
    name="StalledTrainingRule",
    summary="Training stalled",
    detects=(
        "No training step ended (`trainprof.step()`, the callbacks) and no tensor was saved "
        "(`trainprof.torch.watch`) for `threshold` seconds, while the process is still "
        "scraped."
    ),
    recommendation=(
        "Look for a hung collective (one rank died or waits), a deadlocked data loader, or "
        "a blocking I/O call; stop the job rather than let it hold its GPUs."
    ),
    severity="critical",
    parameters=StalledTrainingParams,
    build=_stalled,
    signals=_stalled_signals,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "Native PromQL on the last step's timestamp: `time() - last > threshold`. "
        "`stop_training_on_fire` adds the label action=stop, which the StopTraining "
        "receiver acts on like a configured `stop` rule."
    ),
)


# --- AllZero, TensorVariance, UnchangedTensor, WeightUpdateRatio ----------------------------


@dataclasses.dataclass(frozen=True)
class AllZeroParams:
    collection_names: tuple = param((), NAMES, _COLLECTIONS)
    tensor_regex: str | None = param(None, REGEX, _TENSOR_REGEX)
    threshold: float = param(100, PERCENT, "Percentage of zeros from which it fires.")
    scan_interval_us: int = scan_interval_param()


def _all_zero(b: Build[AllZeroParams]) -> RuleOutput:
    p = b.p
    _warn_regex(b, "tensor_regex", p.tensor_regex)
    zeros = _tensor_sel(b, "trainprof_tensor_zero_ratio", "max", p.collection_names, p.tensor_regex)
    return RuleOutput(
        alerts=(
            Alert(
                expr=f"max {_by_collection(b)} ({zeros})\n>= {p.threshold / 100:.10g}",
                summary="A tensor is all zeros.",
                description=(
                    f"Job {JOB}: a tensor of collection {{{{ $labels.collection }}}} is "
                    f"{{{{ $value | humanizePercentage }}}} zeros (threshold {p.threshold:g}%)."
                ),
            ),
        )
    )


def _all_zero_signals(b, out, scope, _):
    expr = scope.sel("trainprof_tensor_zero_ratio", aggregate="max")
    return (
        _signal(
            "Largest zero fraction",
            expr,
            RATIO_UNIT,
            Threshold(b.p.threshold / 100, f"threshold = {b.p.threshold:g}%", "above"),
        ),
    )


ALL_ZERO = RuleSpec(
    name="AllZero",
    summary="All-zero tensors",
    detects="Some watched tensor with at least `threshold` % of its values equal to zero.",
    recommendation=(
        "An all-zero gradient or activation means the layer does not learn: check for dead "
        "ReLUs, a detached graph, masked inputs, or a layer never used in forward."
    ),
    severity="warning",
    parameters=AllZeroParams,
    build=_all_zero,
    signals=_all_zero_signals,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "Without collection_names or tensor_regex (SageMaker required one) every watched "
        "collection is checked."
    ),
)


@dataclasses.dataclass(frozen=True)
class TensorVarianceParams:
    collection_names: tuple = param((), NAMES, _COLLECTIONS)
    tensor_regex: str | None = param(None, REGEX, _TENSOR_REGEX)
    max_threshold: float | None = param(None, OPTIONAL_NUMBER, "Variance above which it fires.")
    min_threshold: float | None = param(None, OPTIONAL_NUMBER, "Variance below which it fires.")
    scan_interval_us: int = scan_interval_param()


def _tensor_variance(b: Build[TensorVarianceParams]) -> RuleOutput:
    p = b.p
    _warn_regex(b, "tensor_regex", p.tensor_regex)
    parts = []
    if p.max_threshold is not None:
        high = _tensor_sel(
            b, "trainprof_tensor_variance", "max", p.collection_names, p.tensor_regex
        )
        parts.append(f"max {_by_collection(b)} ({high}) > {p.max_threshold:g}")
    if p.min_threshold is not None:
        low = _tensor_sel(b, "trainprof_tensor_variance", "min", p.collection_names, p.tensor_regex)
        parts.append(f"min {_by_collection(b)} ({low}) < {p.min_threshold:g}")
    return RuleOutput(
        alerts=(
            Alert(
                expr="\nor\n".join(parts),
                summary="A tensor's variance is out of range.",
                description=(
                    f"Job {JOB}: a tensor of collection {{{{ $labels.collection }}}} has "
                    f"variance {{{{ $value }}}} (bounds {p.min_threshold} to {p.max_threshold})."
                ),
            ),
        )
    )


def _tensor_variance_check(p: TensorVarianceParams):
    if p.max_threshold is None and p.min_threshold is None:
        return (("max_threshold", "TensorVariance needs max_threshold or min_threshold"),)
    return ()


def _tensor_variance_signals(b, out, scope, _):
    expr = scope.sel("trainprof_tensor_variance", aggregate="max")
    value = b.p.max_threshold if b.p.max_threshold is not None else b.p.min_threshold
    fires = "above" if b.p.max_threshold is not None else "below"
    return (_signal("Variance", expr, NUMBER_UNIT, Threshold(value, f"{value:g}", fires)),)


TENSOR_VARIANCE = RuleSpec(
    name="TensorVariance",
    summary="Tensor variance out of range",
    detects="Some watched tensor's variance above `max_threshold` or below `min_threshold`.",
    recommendation=(
        "Very small variance: the tensor barely changes across its values (saturation, dead "
        "units). Very large: exploding values; lower the learning rate or normalise."
    ),
    severity="warning",
    parameters=TensorVarianceParams,
    build=_tensor_variance,
    signals=_tensor_variance_signals,
    check=_tensor_variance_check,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "Variance is the population variance (ddof 0), as smdebug's reduction; without any "
        "threshold the configuration is refused (SageMaker required them too)."
    ),
)


@dataclasses.dataclass(frozen=True)
class UnchangedTensorParams:
    collection_names: tuple = param((), NAMES, _COLLECTIONS)
    tensor_regex: str | None = param(None, REGEX, _TENSOR_REGEX)
    num_steps: int = param(3, STEPS, "Saved steps in a row that must all be allclose.")
    rtol: float = param(1e-5, NUMBER, "numpy.allclose's rtol.")
    atol: float = param(1e-8, NUMBER, "numpy.allclose's atol.")
    equal_nan: bool = param(False, FLAG, "Accepted; NaN never equals NaN here.")
    scan_interval_us: int = scan_interval_param()


def _unchanged(b: Build[UnchangedTensorParams]) -> RuleOutput:
    p = b.p
    _warn_regex(b, "tensor_regex", p.tensor_regex)
    runs = _tensor_sel(
        b, "trainprof_tensor_unchanged_saves", "max", p.collection_names, p.tensor_regex
    )
    return RuleOutput(
        alerts=(
            Alert(
                expr=f"max {_by_collection(b)} ({runs})\n>= {p.num_steps - 1}",
                summary="A tensor has stopped changing.",
                description=(
                    f"Job {JOB}: a tensor of collection {{{{ $labels.collection }}}} was "
                    f"allclose over its last {{{{ $value }}}} saves (num_steps {p.num_steps})."
                ),
            ),
        )
    )


def _unchanged_signals(b, out, scope, _):
    expr = scope.sel("trainprof_tensor_unchanged_saves", aggregate="max")
    n = b.p.num_steps - 1
    return (_signal("Unchanged saves in a row", expr, NUMBER_UNIT, Threshold(n, f"{n}", "above")),)


def _unchanged_inputs(b: Build[UnchangedTensorParams]):
    if (b.p.rtol, b.p.atol) != (1e-5, 1e-8):
        b.warnings.append(
            f"{b.path('rtol')}: the training process compares with rtol 1e-5, atol 1e-8 by "
            "default; give trainprof.torch.watch(rules_config=...) this configuration"
        )
    return {"unchanged_tolerance": (b.p.rtol, b.p.atol)}


UNCHANGED_TENSOR = RuleSpec(
    name="UnchangedTensor",
    summary="Tensor not changing",
    detects=(
        "A watched tensor allclose (rtol, atol) across its last `num_steps` saves (saves "
        "need not be consecutive steps); a tensor saved fewer times is not judged."
    ),
    recommendation=(
        "A frozen layer, a learning rate of zero, a parameter missing from the optimizer, "
        "or gradients that never reach it."
    ),
    severity="warning",
    parameters=UnchangedTensorParams,
    build=_unchanged,
    signals=_unchanged_signals,
    inputs=_unchanged_inputs,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "The training process keeps a copy of each watched tensor from its previous save "
        "(watch(track_unchanged=False) saves that memory and disables the rule) and counts "
        "consecutive allclose saves; `equal_nan` is accepted, NaN never compares equal."
    ),
)


@dataclasses.dataclass(frozen=True)
class WeightUpdateRatioParams:
    num_steps: int | None = param(None, OPTIONAL_STEPS, "Accepted; the ratio is per step.")
    large_threshold: float = param(10, NUMBER, "Update/weight ratio above which it fires.")
    small_threshold: float = param(1e-8, NUMBER, "Update/weight ratio below which it fires.")
    epsilon: float = param(1e-9, NUMBER, "Added to the weight norm (the process uses 1e-9).")
    scan_interval_us: int = scan_interval_param()


def _update_ratio(b: Build[WeightUpdateRatioParams]) -> RuleOutput:
    p = b.p
    high = _tensor_sel(b, "trainprof_tensor_update_ratio", "max", ("weights",))
    low = _tensor_sel(b, "trainprof_tensor_update_ratio", "min", ("weights",))
    return RuleOutput(
        alerts=(
            Alert(
                expr=(
                    f"max {b.by_job} ({high}) > {p.large_threshold:g}\n"
                    f"or\nmin {b.by_job} ({low}) < {p.small_threshold:g}"
                ),
                summary="Weight updates are out of proportion to the weights.",
                description=(
                    f"Job {JOB}: an optimizer step changed some weights by {{{{ $value }}}} "
                    f"of their norm (bounds {p.small_threshold:g} to {p.large_threshold:g})."
                ),
            ),
        )
    )


def _update_ratio_signals(b, out, scope, _):
    expr = scope.sel("trainprof_tensor_update_ratio", collection="weights")
    return (
        _signal(
            "Update / weight norm",
            expr,
            NUMBER_UNIT,
            Threshold(b.p.large_threshold, f"large_threshold = {b.p.large_threshold:g}", "above"),
        ),
    )


WEIGHT_UPDATE_RATIO = RuleSpec(
    name="WeightUpdateRatio",
    summary="Weight updates too large or too small",
    detects=(
        "The L2 norm of an optimizer step's change to a weight tensor over the weight's L2 "
        "norm, above `large_threshold` or below `small_threshold`."
    ),
    recommendation=(
        "Ratios near 1e-3 are healthy. Much larger: lower the learning rate or clip; much "
        "smaller: the layer barely learns (learning rate, vanishing gradients)."
    ),
    severity="warning",
    parameters=WeightUpdateRatioParams,
    build=_update_ratio,
    signals=_update_ratio_signals,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "The ratio is of one optimizer step at each save (the original compared two saved "
        "steps, which had to be consecutive)."
    ),
)


# --- DeadRelu, SaturatedActivation ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeadReluParams:
    tensor_regex: str | None = param(".*relu_output", REGEX, "Accepted: nn.ReLU outputs.")
    threshold_inactivity: float = param(
        1.0, PERCENT, "A unit active in fewer than this % of positions is dead."
    )
    threshold_layer: float = param(50.0, PERCENT, "Dead units (%) of a layer that fire.")
    scan_interval_us: int = scan_interval_param()


def _dead_relu(b: Build[DeadReluParams]) -> RuleOutput:
    dead = _tensor_sel(b, "trainprof_tensor_dead_unit_ratio", "max", ("relu_output",))
    return RuleOutput(
        alerts=(
            Alert(
                expr=f"max {b.by_job} ({dead})\n> {b.p.threshold_layer / 100:.10g}",
                summary="Most units of a ReLU layer are dead.",
                description=(
                    f"Job {JOB}: {{{{ $value | humanizePercentage }}}} of a ReLU layer's units "
                    f"were active in fewer than {b.p.threshold_inactivity:g}% of positions."
                ),
            ),
        )
    )


def _activation_inputs(b) -> dict:
    if b.p.threshold_inactivity != 1.0:
        b.warnings.append(
            f"{b.path('threshold_inactivity')}: the training process counts units inactive "
            "below 1% by default; give trainprof.torch.watch(rules_config=...) this "
            "configuration"
        )
    return {"threshold_inactivity": b.p.threshold_inactivity}


def _dead_relu_signals(b, out, scope, _):
    expr = scope.sel("trainprof_tensor_dead_unit_ratio", aggregate="max")
    t = b.p.threshold_layer
    return (
        _signal(
            "Dead ReLU units",
            expr,
            RATIO_UNIT,
            Threshold(t / 100, f"threshold_layer = {t:g}%", "above"),
        ),
    )


DEAD_RELU = RuleSpec(
    name="DeadRelu",
    summary="Dead ReLUs",
    detects=(
        "More than `threshold_layer` % of a ReLU layer's units (channels) active (> 0) in "
        "fewer than `threshold_inactivity` % of the batch's positions."
    ),
    recommendation=(
        "Lower the learning rate, use LeakyReLU/GELU, check the initialisation and bias "
        "initialisation, or add normalisation before the activation."
    ),
    severity="warning",
    parameters=DeadReluParams,
    build=_dead_relu,
    signals=_dead_relu_signals,
    inputs=_activation_inputs,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "Units are the channels (axis 1) of N x C x ... activations, else the last axis; the "
        "training process watches nn.ReLU modules (functional relu calls are not seen)."
    ),
)


@dataclasses.dataclass(frozen=True)
class SaturatedActivationParams:
    tensor_regex: str | None = param(
        ".*tanh_input|.*sigmoid_input", REGEX, "Accepted: nn.Tanh / nn.Sigmoid inputs."
    )
    threshold_tanh_min: float = param(-9.4999, NUMBER, "tanh saturates below this input.")
    threshold_tanh_max: float = param(9.4999, NUMBER, "tanh saturates above this input.")
    threshold_sigmoid_min: float = param(-23, NUMBER, "sigmoid saturates below this input.")
    threshold_sigmoid_max: float = param(16.99999, NUMBER, "sigmoid saturates above this.")
    threshold_inactivity: float = param(
        1.0, PERCENT, "A unit inside the bounds in fewer than this % of positions saturates."
    )
    threshold_layer: float = param(50.0, PERCENT, "Saturated units (%) of a layer that fire.")
    scan_interval_us: int = scan_interval_param()


def _saturated(b: Build[SaturatedActivationParams]) -> RuleOutput:
    sat = _tensor_sel(
        b, "trainprof_tensor_saturated_unit_ratio", "max", ("tanh_input", "sigmoid_input")
    )
    return RuleOutput(
        alerts=(
            Alert(
                expr=f"max {_by_collection(b)} ({sat})\n> {b.p.threshold_layer / 100:.10g}",
                summary="Most units of a tanh/sigmoid layer are saturated.",
                description=(
                    f"Job {JOB}: {{{{ $value | humanizePercentage }}}} of a "
                    "{{ $labels.collection }} layer's units are saturated."
                ),
            ),
        )
    )


def _saturated_signals(b, out, scope, _):
    expr = scope.sel("trainprof_tensor_saturated_unit_ratio", aggregate="max")
    t = b.p.threshold_layer
    return (
        _signal(
            "Saturated units",
            expr,
            RATIO_UNIT,
            Threshold(t / 100, f"threshold_layer = {t:g}%", "above"),
        ),
    )


SATURATED_ACTIVATION = RuleSpec(
    name="SaturatedActivation",
    summary="Saturated tanh/sigmoid",
    detects=(
        "More than `threshold_layer` % of a tanh or sigmoid layer's units whose input lies "
        "inside the non-flat range in fewer than `threshold_inactivity` % of positions."
    ),
    recommendation=(
        "Normalise the inputs of the activation (batch/layer norm), lower the learning rate, "
        "or use an activation that does not saturate."
    ),
    severity="warning",
    parameters=SaturatedActivationParams,
    build=_saturated,
    signals=_saturated_signals,
    inputs=_activation_inputs,
    family=_FAMILY,
    reads_exporter=False,
    differences="The bounds are the training process's (SageMaker's defaults).",
)


# --- ClassImbalance, Confusion ------------------------------------------------------------------


def _confusion_parts(b: Build) -> tuple[str, str, str]:
    """(the job's matrix, its diagonal, the job labels) of the confusion counters."""
    job = ", ".join(b.job_labels)
    m = f"sum by ({job}, label_class, predicted_class) ({b.sel('trainprof_classification_samples_total')})"  # noqa: E501
    # The cells whose predicted class equals the true class: PromQL cannot compare two
    # labels, so copy label_class into predicted_class (once per class) and intersect.
    rows = f"sum by ({job}, label_class) ({m})"
    diagonal = (
        f"({m}\nand on ({job}, label_class, predicted_class)\n"
        f'label_replace({rows}, "predicted_class", "$1", "label_class", "(.+)"))'
    )
    return m, diagonal, job


@dataclasses.dataclass(frozen=True)
class ClassImbalanceParams:
    threshold_imbalance: float = param(10, NUMBER, "Largest / smallest class count that fires.")
    threshold_misprediction: float = param(
        0.7, NUMBER, "Fraction of a class's samples mispredicted that fires."
    )
    samples: int = param(500, WHOLE, "Samples to see before deciding.")
    argmax: bool = param(False, FLAG, "Predictions are scores (log_predictions decides).")
    labels_regex: str | None = param(".*labels", REGEX, "Accepted: log_predictions' labels.")
    predictions_regex: str | None = param(".*predictions", REGEX, "Accepted.")
    scan_interval_us: int = scan_interval_param()


def _class_imbalance(b: Build[ClassImbalanceParams]) -> RuleOutput:
    p = b.p
    m, diagonal, job = _confusion_parts(b)
    per_class = f"sum by ({job}, label_class) ({m})"
    total = f"sum {b.by_job} ({m})"
    imbalance = (
        f"(max {b.by_job} ({per_class}) / min {b.by_job} ({per_class}))\n"
        f"> {p.threshold_imbalance:g}\nand {b.on_job}\n{total} >= {p.samples}"
    )
    correct = f"sum by ({job}, label_class) ({diagonal})"
    wrong = f"({per_class} - {correct}\nor\n{per_class})"
    misprediction = (
        f"max {b.by_job} ({wrong} / {per_class})\n> {p.threshold_misprediction:g}\n"
        f"and {b.on_job}\n{total} >= {p.samples}"
    )
    return RuleOutput(
        alerts=(
            Alert(
                expr=f"{imbalance}\nor\n{misprediction}",
                summary="Classes are imbalanced or mostly mispredicted.",
                description=(
                    f"Job {JOB}: class counts differ by a factor of {{{{ $value }}}} or a class "
                    f"is mispredicted that often (thresholds {p.threshold_imbalance:g}x, "
                    f"{p.threshold_misprediction:g})."
                ),
            ),
        )
    )


def _class_signals(b, out, scope, _):
    expr = f"sum by (training_job, label_class) ({scope.sel('trainprof_classification_samples_total')})"  # noqa: E501
    t = b.p.threshold_imbalance
    return (_signal("Samples per class", expr, NUMBER_UNIT, Threshold(t, f"{t:g}x", "above")),)


CLASS_IMBALANCE = RuleSpec(
    name="ClassImbalance",
    summary="Class imbalance",
    detects=(
        "Once `samples` labels were saved: the most frequent class more than "
        "`threshold_imbalance` times the rarest, or a class whose samples are mispredicted "
        "more than `threshold_misprediction` of the time."
    ),
    recommendation=(
        "Resample or weight the classes (a weighted sampler, class weights in the loss), "
        "or collect more data of the rare classes."
    ),
    severity="warning",
    parameters=ClassImbalanceParams,
    build=_class_imbalance,
    signals=_class_signals,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "Counts all saved labels since the process started (Watcher.log_predictions); "
        'class ids from 20 on are counted together as "other".'
    ),
)


@dataclasses.dataclass(frozen=True)
class ConfusionParams:
    category_no: int | None = param(None, OPTIONAL_STEPS, "Accepted; classes are inferred.")
    labels: str | None = param(None, TEXT, "Accepted: log_predictions' labels.")
    predictions: str | None = param(None, TEXT, "Accepted: log_predictions' predictions.")
    labels_collection: str = param("labels", TEXT, "Accepted.")
    predictions_collection: str = param("predictions", TEXT, "Accepted.")
    min_diag: float = param(0.9, NUMBER, "Smallest accepted diagonal share of a column.")
    max_off_diag: float = param(0.1, NUMBER, "Largest accepted off-diagonal share.")
    scan_interval_us: int = scan_interval_param()


def _confusion(b: Build[ConfusionParams]) -> RuleOutput:
    p = b.p
    m, diagonal, job = _confusion_parts(b)
    column = f"sum by ({job}, predicted_class) ({m})"
    diag = f"sum by ({job}, predicted_class) ({diagonal})"
    diag_share = f"({diag}\nor\n{column} * 0)\n/\n{column}"
    off = f"({m}\nunless\n{diagonal})"
    off_share = f"{off}\n/ on ({job}, predicted_class) group_left\n{column}"
    expr = (
        f"min {b.by_job} ({diag_share}) < {p.min_diag:g}\n"
        f"or\nmax {b.by_job} ({off_share}) > {p.max_off_diag:g}"
    )
    return RuleOutput(
        alerts=(
            Alert(
                expr=expr,
                summary="The confusion matrix is poor.",
                description=(
                    f"Job {JOB}: a predicted class's column has a diagonal or off-diagonal "
                    f"share of {{{{ $value | humanizePercentage }}}} (min_diag {p.min_diag:g}, "
                    f"max_off_diag {p.max_off_diag:g})."
                ),
            ),
        )
    )


def _confusion_signals(b, out, scope, _):
    expr = scope.sel("trainprof_classification_samples_total")
    return (
        _signal(
            "Confusion matrix",
            expr,
            NUMBER_UNIT,
            Threshold(b.p.min_diag, f"min_diag = {b.p.min_diag:g}", "below"),
        ),
    )


CONFUSION = RuleSpec(
    name="Confusion",
    summary="Poor confusion matrix",
    detects=(
        "Over all saved predictions, for each predicted class (column): the share of its "
        "predictions that were right below `min_diag`, or the share of one wrong true class "
        "above `max_off_diag`."
    ),
    recommendation=(
        "Look at which classes are confused: merge or relabel them, add data, or weight the "
        "classes."
    ),
    severity="warning",
    parameters=ConfusionParams,
    build=_confusion,
    signals=_confusion_signals,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "Each cell is normalised by its predicted column, `M[i][i] / sum_j M[j][i]` (empty "
        "columns skipped): the documented per-row formula cannot be right, since perfect "
        "10-class predictions would give 1/10 < min_diag; the column reading reproduces the "
        "original's tests."
    ),
)


# --- CheckInputImages, NLPSequenceRatio -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CheckInputImagesParams:
    threshold_mean: float = param(0.2, NUMBER, "|mean| of a channel above which it fires.")
    threshold_samples: int = param(500, WHOLE, "Images to see before deciding.")
    regex: str | None = param(".*hybridsequential0_input_0", REGEX, "Accepted: log_inputs().")
    channel: int = param(1, WHOLE, "Axis of the channels (the process uses axis 1).")
    scan_interval_us: int = scan_interval_param()


def _input_images(b: Build[CheckInputImagesParams]) -> RuleOutput:
    p = b.p
    if p.channel != 1:
        b.warnings.append(
            f"{b.path('channel')}: the training process averages axis 1 (N x C x H x W); "
            "pass channel-first images to Watcher.log_inputs"
        )
    means = b.sel("trainprof_input_channel_mean")
    count = b.sel("trainprof_input_samples_total")
    return RuleOutput(
        alerts=(
            Alert(
                expr=(
                    f"max {b.by_job} (abs({means})) > {p.threshold_mean:g}\n"
                    f"and {b.on_job}\nmax {b.by_job} ({count}) >= {p.threshold_samples}"
                ),
                summary="Input images are not normalised.",
                description=(
                    f"Job {JOB}: an input channel's mean is {{{{ $value }}}}, beyond "
                    f"±{p.threshold_mean:g}."
                ),
            ),
        )
    )


def _input_signals(b, out, scope, _):
    expr = scope.sel("trainprof_input_channel_mean")
    t = b.p.threshold_mean
    return (_signal("Input channel means", expr, NUMBER_UNIT, Threshold(t, f"±{t:g}", "above")),)


CHECK_INPUT_IMAGES = RuleSpec(
    name="CheckInputImages",
    summary="Input images not normalised",
    detects=(
        "Once `threshold_samples` images were saved, the mean of some input channel over "
        "all of them beyond ±`threshold_mean`."
    ),
    recommendation="Normalise the inputs (subtract the dataset mean, divide by its std).",
    severity="warning",
    parameters=CheckInputImagesParams,
    build=_input_images,
    signals=_input_signals,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "Inputs come from Watcher.log_inputs (channels on axis 1) on saving steps; the mean "
        "is over all saved images since the process started."
    ),
)


@dataclasses.dataclass(frozen=True)
class NLPSequenceRatioParams:
    tokens_regex: str | None = param(".*embedding0_input_0", REGEX, "Accepted: log_tokens().")
    token_values: tuple = param((0.0,), NUMBERS, "Token ids to count (comma-separated).")
    token_thresholds_percent: tuple = param(
        (50.0,), NUMBERS, "Percent of tokens, one per token value, above which it fires."
    )
    scan_interval_us: int = scan_interval_param()


def _nlp_ratio(b: Build[NLPSequenceRatioParams]) -> RuleOutput:
    p = b.p
    total = b.sel("trainprof_input_tokens_total")
    parts = []
    for token, percent in zip(p.token_values, p.token_thresholds_percent):
        matches = b.sel("trainprof_input_token_matches_total", token=str(int(token)))
        parts.append(f"{matches}\n/ ignoring (token) group_left\n{total}\n> {percent / 100:.10g}")
    return RuleOutput(
        alerts=(
            Alert(
                expr="\nor\n".join(parts),
                summary="Sequences are mostly one token (padding?).",
                description=(
                    f"Job {JOB}: {{{{ $value | humanizePercentage }}}} of the input tokens are "
                    "{{ $labels.token }}."
                ),
            ),
        )
    )


def _nlp_check(p: NLPSequenceRatioParams):
    if len(p.token_values) != len(p.token_thresholds_percent):
        return (
            (
                "token_thresholds_percent",
                f"{len(p.token_thresholds_percent)} threshold(s) for "
                f"{len(p.token_values)} token value(s); give one per token value",
            ),
        )
    return ()


def _nlp_inputs(b: Build[NLPSequenceRatioParams]):
    if tuple(p for p in b.p.token_values) != (0.0,):
        b.warnings.append(
            f"{b.path('token_values')}: the training process counts token 0 by default; give "
            "trainprof.torch.watch(rules_config=...) this configuration"
        )
    return {"token_values": tuple(int(t) for t in b.p.token_values)}


def _nlp_signals(b, out, scope, _):
    expr = (
        f"{scope.sel('trainprof_input_token_matches_total')}\n/ ignoring (token) group_left\n"
        f"{scope.sel('trainprof_input_tokens_total')}"
    )
    t = b.p.token_thresholds_percent[0] if b.p.token_thresholds_percent else 50
    return (_signal("Token share", expr, RATIO_UNIT, Threshold(t / 100, f"{t:g}%", "above")),)


NLP_SEQUENCE_RATIO = RuleSpec(
    name="NLPSequenceRatio",
    summary="Sequences dominated by one token",
    detects=(
        "The share of saved input token positions equal to each of `token_values` above its "
        "`token_thresholds_percent` (by default: more than half padding)."
    ),
    recommendation=(
        "Bucket sequences by length or pack them, so batches carry less padding; check the "
        "tokenizer's truncation and padding settings."
    ),
    severity="warning",
    parameters=NLPSequenceRatioParams,
    build=_nlp_ratio,
    signals=_nlp_signals,
    check=_nlp_check,
    inputs=_nlp_inputs,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "Token ids come from Watcher.log_tokens on saving steps and are counted since the "
        "process started; token values other than 0 must be given to watch(token_values=) or "
        "watch(rules_config=)."
    ),
)


# --- XGBoost: FeatureImportanceOverweight, TreeDepth ----------------------------------------


@dataclasses.dataclass(frozen=True)
class FeatureImportanceOverweightParams:
    threshold: float = param(0.8, NUMBER, "Share of the top nfeatures above which it fires.")
    nfeatures: int = param(3, STEPS, "How many of the most important features (1-10).")
    tensor_regex: str | None = param(".*feature_importance/weight", REGEX, "Accepted.")
    scan_interval_us: int = scan_interval_param()


def _importance(b: Build[FeatureImportanceOverweightParams]) -> RuleOutput:
    p = b.p
    top = b.sel("trainprof_xgboost_feature_importance_top_ratio", top=str(p.nfeatures))
    return RuleOutput(
        alerts=(
            Alert(
                expr=f"{top} > {p.threshold:g}",
                summary="A few features carry most of the importance.",
                description=(
                    f"Job {JOB}: the top {p.nfeatures} features hold "
                    f"{{{{ $value | humanizePercentage }}}} of the importance."
                ),
            ),
        )
    )


def _importance_check(p: FeatureImportanceOverweightParams):
    if p.nfeatures > 10:
        return (("nfeatures", f"{p.nfeatures} is above 10, the most the callback publishes"),)
    return ()


def _importance_signals(b, out, scope, _):
    expr = scope.sel("trainprof_xgboost_feature_importance_top_ratio", top=str(b.p.nfeatures))
    return (
        _signal(
            f"Importance of the top {b.p.nfeatures} features",
            expr,
            RATIO_UNIT,
            Threshold(b.p.threshold, f"threshold = {b.p.threshold:g}", "above"),
        ),
    )


FEATURE_IMPORTANCE_OVERWEIGHT = RuleSpec(
    name="FeatureImportanceOverweight",
    summary="Feature importance concentrated (XGBoost)",
    detects=(
        "The `nfeatures` most important features of an XGBoost model holding more than "
        "`threshold` of the total importance."
    ),
    recommendation=(
        "Check for leakage (a feature that encodes the label), or remove/regularise the "
        "dominant features and compare."
    ),
    severity="warning",
    parameters=FeatureImportanceOverweightParams,
    build=_importance,
    signals=_importance_signals,
    check=_importance_check,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "The XGBoost callback publishes the shares of the top 1 to 10 features (importance "
        "type weight by default), so `nfeatures` is at most 10."
    ),
)


@dataclasses.dataclass(frozen=True)
class TreeDepthParams:
    depth: int = param(4, STEPS, "Depth the trees are expected to reach.")
    scan_interval_us: int = scan_interval_param()


def _tree_depth(b: Build[TreeDepthParams]) -> RuleOutput:
    depth = b.sel("trainprof_xgboost_tree_depth")
    return RuleOutput(
        alerts=(
            Alert(
                expr=f"{depth} < {b.p.depth}",
                summary="XGBoost trees stay shallower than expected.",
                description=(
                    f"Job {JOB}: the deepest tree has depth {{{{ $value }}}}, below "
                    f"{b.p.depth}: splits stopped improving the loss."
                ),
            ),
        )
    )


def _tree_signals(b, out, scope, _):
    expr = scope.sel("trainprof_xgboost_tree_depth")
    return (
        _signal("Tree depth", expr, NUMBER_UNIT, Threshold(b.p.depth, f"{b.p.depth}", "below")),
    )


TREE_DEPTH = RuleSpec(
    name="TreeDepth",
    summary="Trees shallower than their depth (XGBoost)",
    detects="The deepest tree of an XGBoost model shallower than `depth`.",
    recommendation=(
        "XGBoost rejected the deeper splits as not improving the loss: lower max_depth to "
        "what the trees reach (faster, less overfitting), or relax gamma/min_child_weight."
    ),
    severity="info",
    parameters=TreeDepthParams,
    build=_tree_depth,
    signals=_tree_signals,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "Depth is measured on the trees themselves (root at 0), not as log2 of the largest "
        "node id. The direction is undocumented; trainprof fires when trees stay shallower "
        "than `depth`. Replaying a trial reads the XGBoost hook's `trees` collection, which "
        "holds one tree per saved round (tree number = round): the depth is that of the deepest "
        "saved tree so far (live, the callback measures every tree)."
    ),
)


# --- PoorWeightInitialization ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PoorWeightInitializationParams:
    activation_inputs_regex: str | None = param(
        ".*relu_input|.*tanh_input|.*sigmoid_input",
        REGEX,
        "Accepted: the inputs of nn.ReLU, nn.Tanh and nn.Sigmoid modules.",
    )
    threshold: float = param(
        10.0, NUMBER, "Largest / smallest activation-input variance across layers that fires."
    )
    distribution_range: float = param(
        0.001, NUMBER, "A gradient whose 95th - 5th percentile is below this fires."
    )
    patience: int = param(5, STEPS, "Saved losses without improvement that fire.")
    steps: int = param(10, STEPS, "Only the first steps are judged.")
    scan_interval_us: int = scan_interval_param()


_ACTIVATION_INPUTS = ("relu_input", "tanh_input", "sigmoid_input")


def _poor_init(b: Build[PoorWeightInitializationParams]) -> RuleOutput:
    p = b.p
    high = _tensor_sel(b, "trainprof_tensor_variance", "max", _ACTIVATION_INPUTS)
    low = _tensor_sel(b, "trainprof_tensor_variance", "min", _ACTIVATION_INPUTS)
    spread = _tensor_sel(b, "trainprof_tensor_percentile_spread", "min", ("gradients",))
    since = b.sel("trainprof_training_loss_saves_since_improvement", mode="train")
    early = b.sel("trainprof_tensor_last_save_step")
    loss_early = b.sel("trainprof_training_loss_step", mode="train")
    expr = (
        f"(\n  max {b.by_job} ({high})\n  / min {b.by_job} ({low})\n  > {p.threshold:g}\n"
        f"  or\n  min {b.by_job} ({spread}) < {p.distribution_range:g}\n)\n"
        f"and {b.on_job}\nmax {b.by_job} ({early}) <= {p.steps}\n"
        f"or\nmax {b.by_job} ({since}) >= {p.patience}\n"
        f"and {b.on_job}\nmax {b.by_job} ({loss_early}) <= {p.steps}"
    )
    return RuleOutput(
        alerts=(
            Alert(
                expr=expr,
                summary="The weights look poorly initialised.",
                description=(
                    f"Job {JOB}: in its first {p.steps} steps, activation-input variances differ "
                    f"across layers by more than {p.threshold:g}x, a gradient's 5-95 percentile "
                    f"range is below {p.distribution_range:g}, or the loss did not improve for "
                    f"{p.patience} saves (value {{{{ $value }}}})."
                ),
            ),
        )
    )


def _poor_init_signals(b, out, scope, _):
    expr = scope.sel("trainprof_tensor_variance", collection="relu_input")
    t = b.p.threshold
    return (
        _signal("Activation-input variance", expr, NUMBER_UNIT, Threshold(t, f"{t:g}x", "above")),
    )


POOR_WEIGHT_INITIALIZATION = RuleSpec(
    name="PoorWeightInitialization",
    summary="Poor weight initialisation",
    detects=(
        "Within the first `steps` steps: the variances of the activations' inputs differ "
        "across layers by more than `threshold` times, some gradient's 5th-95th percentile "
        "range is narrower than `distribution_range`, or the training loss has not improved "
        "for `patience` saves."
    ),
    recommendation=(
        "Use an initialisation suited to the activation (He/Kaiming for ReLU, Xavier/Glorot "
        "for tanh/sigmoid), check custom init code, and add normalisation layers."
    ),
    severity="warning",
    parameters=PoorWeightInitializationParams,
    build=_poor_init,
    signals=_poor_init_signals,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "Layers are nn.ReLU/nn.Tanh/nn.Sigmoid modules (their inputs' variance, collections "
        "relu_input, tanh_input, sigmoid_input); percentiles are over an even sample of at most "
        "100,000 elements of each gradient; 'loss not decreasing' counts saves without an "
        "improvement over 0.01 (Overtraining's delta)."
    ),
)


# --- SimilarAcrossRuns ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SimilarAcrossRunsParams:
    other_trials: str | None = param(
        None, TEXT, "The other job: its training_job live, its trial folder in replay."
    )
    collection_names: tuple = param((), NAMES, _COLLECTIONS)
    tensor_regex: str | None = param(None, REGEX, _TENSOR_REGEX)
    scan_interval_us: int = scan_interval_param()


def _similar(b: Build[SimilarAcrossRunsParams]) -> RuleOutput:
    p = b.p
    _warn_regex(b, "tensor_regex", p.tensor_regex)
    other = str(p.other_trials)
    keep = "collection, tensor, aggregate"

    def norms(op: str) -> str:
        sel = _tensor_sel(b, "trainprof_tensor_l2_norm", "max", p.collection_names, p.tensor_regex)
        sel = sel.replace("{", "{" + f"training_job{op}{promql.quote(other)}, ", 1)
        return sel

    def steps(op: str) -> str:
        sel = b.sel("trainprof_tensor_last_save_step")
        if "{" in sel:
            return sel.replace("{", "{" + f"training_job{op}{promql.quote(other)}, ", 1)
        return f"{sel}{{training_job{op}{promql.quote(other)}}}"

    job = ", ".join(b.job_labels)
    mine = f"max by ({job}, {keep}) ({norms('!=')})"
    theirs = f"max by ({keep}) ({norms('=')})"
    same_step = (
        f"max by ({job}) ({steps('!=')})\n== ignoring ({job}) group_left\nmax ({steps('=')})"
    )
    expr = (
        f"abs({mine}\n- on ({keep}) group_left\n{theirs})\n"
        f"> on ({keep}) group_left ()\n(1e-05 * abs({theirs}) + 1e-08)\n"
        f"and on ({job})\n({same_step})"
    )
    return RuleOutput(
        alerts=(
            Alert(
                expr=expr,
                summary="Two runs' tensors differ at the same step.",
                description=(
                    f"Job {JOB}: the L2 norm of a {{{{ $labels.collection }}}} tensor differs "
                    f"from job {other}'s at the same saved step by {{{{ $value }}}}."
                ),
            ),
        )
    )


def _similar_check(p: SimilarAcrossRunsParams):
    if not p.other_trials:
        return (("other_trials", "SimilarAcrossRuns needs other_trials: the job to compare with"),)
    return ()


def _similar_signals(b, out, scope, _):
    expr = scope.sel("trainprof_tensor_l2_norm", aggregate="max")
    return (_signal("L2 norms", expr, NUMBER_UNIT, Threshold(0, "the other run's", "above")),)


SIMILAR_ACROSS_RUNS = RuleSpec(
    name="SimilarAcrossRuns",
    summary="Runs that should match differ",
    detects=(
        "Two jobs (this one and `other_trials`) at the same saved step whose watched tensors' "
        "L2 norms differ (beyond rtol 1e-5, atol 1e-8): a supposedly reproducible run is not."
    ),
    recommendation=(
        "Fix the seeds (torch, numpy, the data loader's workers), disable non-deterministic "
        "kernels (torch.use_deterministic_algorithms), and compare the data order."
    ),
    severity="info",
    parameters=SimilarAcrossRunsParams,
    build=_similar,
    signals=_similar_signals,
    check=_similar_check,
    family=_FAMILY,
    reads_exporter=False,
    differences=(
        "Compares the per-collection (and per-tensor, with include_regex) L2 norms of the two "
        "jobs' latest saves when both saved the same step, not every element; live, "
        "`other_trials` is the other job's training_job; in replay, the other trial's folder."
    ),
)


TENSOR_RULES = (
    VANISHING_GRADIENT,
    EXPLODING_TENSOR,
    LOSS_NOT_DECREASING,
    OVERFIT,
    OVERTRAINING,
    STALLED_TRAINING,
    ALL_ZERO,
    TENSOR_VARIANCE,
    UNCHANGED_TENSOR,
    WEIGHT_UPDATE_RATIO,
    DEAD_RELU,
    SATURATED_ACTIVATION,
    CLASS_IMBALANCE,
    CONFUSION,
    CHECK_INPUT_IMAGES,
    NLP_SEQUENCE_RATIO,
    FEATURE_IMPORTANCE_OVERWEIGHT,
    TREE_DEPTH,
    SIMILAR_ACROSS_RUNS,
    POOR_WEIGHT_INITIALIZATION,
)

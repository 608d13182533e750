"""The gradients and the optimizer's steps: VanishingGradient, ExplodingTensor,
WeightUpdateRatio."""

from __future__ import annotations

import dataclasses

from trainprof.contract import metrics as contract
from trainprof.contract.names import JOB_LABEL
from trainprof.rules import promql
from trainprof.rules.catalog._text import JOB
from trainprof.rules.catalog.health.common import (
    COLLECTIONS,
    TENSOR_REGEX,
    by_collection,
    one_alert,
    setting,
    tensor_rule,
    tensor_sel,
    threshold_signal,
    warn_regex,
)
from trainprof.rules.model import NUMBER_UNIT, Build, RuleOutput, Selects, Threshold
from trainprof.rules.params import param, scan_interval_param
from trainprof.rules.tensor_params import FLAG, NAMES, NUMBER, OPTIONAL_STEPS, REGEX

# --- VanishingGradient ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class VanishingGradientParams:
    threshold: float = param(1e-7, NUMBER, "Mean |gradient| below which a gradient vanishes.")
    scan_interval_us: int = scan_interval_param()


def _vanishing(b: Build[VanishingGradientParams]) -> RuleOutput:
    grads = tensor_sel(b, contract.TENSOR_MEAN_ABS, "min", ("gradients",))
    return one_alert(
        expr=f"min {b.by_job} ({grads})\n< {b.p.threshold:g}",
        summary="Gradients have vanished.",
        description=(
            f"Job {JOB}: the smallest mean |gradient| of a watched tensor is "
            f"{{{{ $value }}}}, below {b.p.threshold:g}."
        ),
    )


def _smallest_gradient(scope: Selects) -> str:
    grads = scope.sel(contract.TENSOR_MEAN_ABS, collection="gradients", aggregate="min")
    return f"min {scope.by_job} ({grads})"


VANISHING_GRADIENT = tensor_rule(
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
    signals=threshold_signal(
        "Smallest mean |gradient|", NUMBER_UNIT, _smallest_gradient, setting("threshold", "below")
    ),
    differences=(
        "The mean |gradient| is computed on the device at each save by trainprof.torch.watch; "
        "the rule reads the smallest over the gradients collection, so it names the "
        "collection, not the tensor (watch with include_regex for per-tensor series)."
    ),
)


# --- ExplodingTensor ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ExplodingTensorParams:
    collection_names: tuple = param((), NAMES, COLLECTIONS)
    tensor_regex: str | None = param(None, REGEX, TENSOR_REGEX)
    only_nan: bool = param(False, FLAG, "Count NaN only, not infinities.")
    scan_interval_us: int = scan_interval_param()


def _exploding(b: Build[ExplodingTensorParams]) -> RuleOutput:
    p = b.p
    warn_regex(b, "tensor_regex", p.tensor_regex)
    nan = tensor_sel(b, contract.TENSOR_NAN_VALUES, "max", p.collection_names, p.tensor_regex)
    bad = nan
    if not p.only_nan:
        inf = tensor_sel(b, contract.TENSOR_INF_VALUES, "max", p.collection_names, p.tensor_regex)
        bad = f"{nan} + {inf}"
    loss = b.sel(contract.TRAINING_LOSS)
    loss_bad = f"{loss} != {loss}" if p.only_nan else f"({loss} != {loss}) or abs({loss}) == +Inf"
    expr = f"max {by_collection(b)} ({bad}) > 0"
    if not p.collection_names and not p.tensor_regex:
        expr += f"\nor\ncount {b.by_job} ({loss_bad}) > 0"
    return one_alert(
        expr=expr,
        summary="Tensors hold NaN or infinite values.",
        description=(
            f"Job {JOB}: {{{{ $value }}}} non-finite value(s) in the latest save of "
            "collection {{ $labels.collection }} (or in the loss)."
        ),
    )


def _non_finite(scope: Selects) -> str:
    return (
        f"max {promql.by((JOB_LABEL, 'collection'))} "
        f"({scope.sel('trainprof_tensor_nan_values', aggregate='max')} + "
        f"{scope.sel('trainprof_tensor_inf_values', aggregate='max')})"
    )


EXPLODING_TENSOR = tensor_rule(
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
    signals=threshold_signal(
        "Non-finite values", NUMBER_UNIT, _non_finite, lambda p: Threshold(0, "any", "above")
    ),
    differences=(
        "Reads NaN/Inf counts per collection (and the loss) instead of scanning every tensor; "
        "`tensor_regex` needs the tensors' own series (include_regex)."
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
    high = tensor_sel(b, contract.TENSOR_UPDATE_RATIO, "max", ("weights",))
    low = tensor_sel(b, contract.TENSOR_UPDATE_RATIO, "min", ("weights",))
    return one_alert(
        expr=(
            f"max {b.by_job} ({high}) > {p.large_threshold:g}\n"
            f"or\nmin {b.by_job} ({low}) < {p.small_threshold:g}"
        ),
        summary="Weight updates are out of proportion to the weights.",
        description=(
            f"Job {JOB}: an optimizer step changed some weights by {{{{ $value }}}} "
            f"of their norm (bounds {p.small_threshold:g} to {p.large_threshold:g})."
        ),
    )


WEIGHT_UPDATE_RATIO = tensor_rule(
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
    signals=threshold_signal(
        "Update / weight norm",
        NUMBER_UNIT,
        contract.TENSOR_UPDATE_RATIO,
        setting("large_threshold", "above"),
        collection="weights",
    ),
    differences=(
        "The ratio is of one optimizer step at each save (the original compared two saved "
        "steps, which had to be consecutive)."
    ),
)

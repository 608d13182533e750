"""The gradients and the watched tensors: VanishingGradient, ExplodingTensor and
WeightUpdateRatio (the gradients and the optimizer's steps); AllZero, TensorVariance and
UnchangedTensor (what a tensor holds and how it changes); SimilarAcrossRuns (two jobs'
tensors at the same step)."""

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
    collections,
    one_alert,
    setting,
    tensor_rule,
    tensor_sel,
    threshold_signal,
    warn_process_default,
    warn_regex,
    watched,
)
from trainprof.rules.model import (
    NUMBER_UNIT,
    RATIO_UNIT,
    Build,
    Population,
    RuleOutput,
    Selects,
    Threshold,
    Units,
)
from trainprof.rules.params import PERCENT, param, scan_interval_param
from trainprof.rules.tensor_params import (
    FLAG,
    NAMES,
    NUMBER,
    OPTIONAL_NUMBER,
    OPTIONAL_STEPS,
    REGEX,
    STEPS,
    TEXT,
)

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
    nan = watched(b, contract.TENSOR_NAN_VALUES, "max")
    bad = nan
    if not p.only_nan:
        inf = watched(b, contract.TENSOR_INF_VALUES, "max")
        bad = f"{nan} + {inf}"
    loss = b.sel(contract.TRAINING_LOSS)
    loss_bad = f"{loss} != {loss}" if p.only_nan else f"({loss} != {loss}) or abs({loss}) == +Inf"
    expr = f"max {by_collection(b)} ({bad}) > 0"
    if not p.collection_names and not p.tensor_regex:
        expr += f"\nor\ncount {b.by_job} ({loss_bad}) > 0"
    return one_alert(
        expr=expr,
        units=collections(contract.TENSOR_NAN_VALUES, what="non-finite values"),
        summary="Tensors hold NaN or infinite values.",
        description="held NaN or infinite values in their latest save",
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


# --- AllZero, TensorVariance, UnchangedTensor ----------------------------------------------


@dataclasses.dataclass(frozen=True)
class AllZeroParams:
    collection_names: tuple = param((), NAMES, COLLECTIONS)
    tensor_regex: str | None = param(None, REGEX, TENSOR_REGEX)
    threshold: float = param(100, PERCENT, "Percentage of zeros from which it fires.")
    scan_interval_us: int = scan_interval_param()


def _all_zero(b: Build[AllZeroParams]) -> RuleOutput:
    p = b.p
    warn_regex(b, "tensor_regex", p.tensor_regex)
    zeros = watched(b, contract.TENSOR_ZERO_RATIO, "max")
    return one_alert(
        expr=f"max {by_collection(b)} ({zeros})\n>= {p.threshold / 100:.10g}",
        units=collections(
            contract.TENSOR_ZERO_RATIO, "{{ .Value | humanizePercentage }}", "share of zeros"
        ),
        summary="A tensor is all zeros.",
        description=f"held a tensor that is at least {p.threshold:g}% zeros",
    )


ALL_ZERO = tensor_rule(
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
    signals=threshold_signal(
        "Largest zero fraction",
        RATIO_UNIT,
        contract.TENSOR_ZERO_RATIO,
        setting("threshold", "above", suffix="%"),
        aggregate="max",
    ),
    differences=(
        "Without collection_names or tensor_regex (SageMaker required one) every watched "
        "collection is checked."
    ),
)


@dataclasses.dataclass(frozen=True)
class TensorVarianceParams:
    collection_names: tuple = param((), NAMES, COLLECTIONS)
    tensor_regex: str | None = param(None, REGEX, TENSOR_REGEX)
    max_threshold: float | None = param(None, OPTIONAL_NUMBER, "Variance above which it fires.")
    min_threshold: float | None = param(None, OPTIONAL_NUMBER, "Variance below which it fires.")
    scan_interval_us: int = scan_interval_param()


def _tensor_variance(b: Build[TensorVarianceParams]) -> RuleOutput:
    p = b.p
    warn_regex(b, "tensor_regex", p.tensor_regex)
    parts = []
    if p.max_threshold is not None:
        high = watched(b, contract.TENSOR_VARIANCE, "max")
        parts.append(f"max {by_collection(b)} ({high}) > {p.max_threshold:g}")
    if p.min_threshold is not None:
        low = watched(b, contract.TENSOR_VARIANCE, "min")
        parts.append(f"min {by_collection(b)} ({low}) < {p.min_threshold:g}")
    return one_alert(
        expr="\nor\n".join(parts),
        units=collections(contract.TENSOR_VARIANCE, what="variance"),
        summary="A tensor's variance is out of range.",
        description=(
            f"held a tensor whose variance is outside {p.min_threshold} to {p.max_threshold}"
        ),
    )


def _tensor_variance_check(p: TensorVarianceParams):
    if p.max_threshold is None and p.min_threshold is None:
        return (("max_threshold", "TensorVariance needs max_threshold or min_threshold"),)
    return ()


def _variance_line(p) -> Threshold:
    value = p.max_threshold if p.max_threshold is not None else p.min_threshold
    fires = "above" if p.max_threshold is not None else "below"
    return Threshold(value, f"{value:g}", fires)


TENSOR_VARIANCE = tensor_rule(
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
    signals=threshold_signal(
        "Variance", NUMBER_UNIT, contract.TENSOR_VARIANCE, _variance_line, aggregate="max"
    ),
    check=_tensor_variance_check,
    differences=(
        "Variance is the population variance (ddof 0), as smdebug's reduction; without any "
        "threshold the configuration is refused (SageMaker required them too)."
    ),
)


@dataclasses.dataclass(frozen=True)
class UnchangedTensorParams:
    collection_names: tuple = param((), NAMES, COLLECTIONS)
    tensor_regex: str | None = param(None, REGEX, TENSOR_REGEX)
    num_steps: int = param(3, STEPS, "Saved steps in a row that must all be allclose.")
    rtol: float = param(1e-5, NUMBER, "numpy.allclose's rtol.")
    atol: float = param(1e-8, NUMBER, "numpy.allclose's atol.")
    equal_nan: bool = param(False, FLAG, "Accepted; NaN never equals NaN here.")
    scan_interval_us: int = scan_interval_param()


def _unchanged(b: Build[UnchangedTensorParams]) -> RuleOutput:
    p = b.p
    warn_regex(b, "tensor_regex", p.tensor_regex)
    runs = watched(b, contract.TENSOR_UNCHANGED_SAVES, "max")
    return one_alert(
        expr=f"max {by_collection(b)} ({runs})\n>= {p.num_steps - 1}",
        units=collections(contract.TENSOR_UNCHANGED_SAVES, what="saves unchanged"),
        summary="A tensor has stopped changing.",
        description=(
            f"held a tensor that stayed allclose over {p.num_steps - 1} saves or more "
            f"(num_steps {p.num_steps})"
        ),
    )


def _unchanged_inputs(b: Build[UnchangedTensorParams]):
    if (b.p.rtol, b.p.atol) != (1e-5, 1e-8):
        warn_process_default(b, "rtol", "compares with rtol 1e-5, atol 1e-8")
    return {"unchanged_tolerance": (b.p.rtol, b.p.atol)}


UNCHANGED_TENSOR = tensor_rule(
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
    signals=threshold_signal(
        "Unchanged saves in a row",
        NUMBER_UNIT,
        contract.TENSOR_UNCHANGED_SAVES,
        lambda p: Threshold(p.num_steps - 1, f"{p.num_steps - 1}", "above"),
        aggregate="max",
    ),
    inputs=_unchanged_inputs,
    differences=(
        "The training process keeps a copy of each watched tensor from its previous save "
        "(watch(track_unchanged=False) saves that memory and disables the rule) and counts "
        "consecutive allclose saves; `equal_nan` is accepted, NaN never compares equal."
    ),
)


# --- SimilarAcrossRuns ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SimilarAcrossRunsParams:
    other_trials: str | None = param(
        None, TEXT, "The other job: its training_job live, its trial folder in replay."
    )
    collection_names: tuple = param((), NAMES, COLLECTIONS)
    tensor_regex: str | None = param(None, REGEX, TENSOR_REGEX)
    scan_interval_us: int = scan_interval_param()


def _similar(b: Build[SimilarAcrossRunsParams]) -> RuleOutput:
    p = b.p
    warn_regex(b, "tensor_regex", p.tensor_regex)
    other = str(p.other_trials)
    keep = "collection, tensor, aggregate"

    def norms(op: str) -> str:
        sel = watched(b, contract.TENSOR_L2_NORM, "max")
        sel = sel.replace("{", "{" + f"training_job{op}{promql.quote(other)}, ", 1)
        return sel

    def steps(op: str) -> str:
        sel = b.sel(contract.TENSOR_LAST_SAVE_STEP)
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
    return one_alert(
        expr=expr,
        units=Units(
            "tensor",
            "tensor",
            "tensors",
            "{{ .Labels.collection }} {{ .Labels.tensor }}",
            Population(contract.TENSOR_L2_NORM, {"aggregate": "max"}, ("collection", "tensor")),
            value_text="L2 norm difference",
        ),
        summary="Two runs' tensors differ at the same step.",
        description=f"had an L2 norm different from job {other}'s at the same saved step",
    )


def _similar_check(p: SimilarAcrossRunsParams):
    if not p.other_trials:
        return (("other_trials", "SimilarAcrossRuns needs other_trials: the job to compare with"),)
    return ()


SIMILAR_ACROSS_RUNS = tensor_rule(
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
    signals=threshold_signal(
        "L2 norms",
        NUMBER_UNIT,
        contract.TENSOR_L2_NORM,
        lambda p: Threshold(0, "the other run's", "above"),
        aggregate="max",
    ),
    check=_similar_check,
    differences=(
        "Compares the per-collection (and per-tensor, with include_regex) L2 norms of the two "
        "jobs' latest saves when both saved the same step, not every element; live, "
        "`other_trials` is the other job's training_job; in replay, the other trial's folder."
    ),
)

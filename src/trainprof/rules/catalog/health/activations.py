"""The activations: DeadRelu, SaturatedActivation, and PoorWeightInitialization (the
activations' inputs and the gradients of the first steps)."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainprof.contract import metrics as contract
from trainprof.rules.catalog._text import JOB
from trainprof.rules.catalog.health.common import (
    by_collection,
    collections,
    one_alert,
    setting,
    tensor_rule,
    tensor_sel,
    threshold_signal,
    warn_process_default,
)
from trainprof.rules.model import NUMBER_UNIT, RATIO_UNIT, Build, RuleOutput, RuleSpec, Threshold
from trainprof.rules.params import PERCENT, param, scan_interval_param
from trainprof.rules.tensor_params import NUMBER, REGEX, STEPS

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
    dead = tensor_sel(b, contract.TENSOR_DEAD_UNIT_RATIO, "max", ("relu_output",))
    return one_alert(
        expr=f"max {b.by_job} ({dead})\n> {b.p.threshold_layer / 100:.10g}",
        summary="Most units of a ReLU layer are dead.",
        description=(
            f"Job {JOB}: {{{{ $value | humanizePercentage }}}} of a ReLU layer's units "
            f"were active in fewer than {b.p.threshold_inactivity:g}% of positions."
        ),
    )


def _activation_inputs(b) -> dict:
    if b.p.threshold_inactivity != 1.0:
        warn_process_default(b, "threshold_inactivity", "counts units inactive below 1%")
    return {"threshold_inactivity": b.p.threshold_inactivity}


def _layer_share_rule(metric: str, drawn: str, **fields: Any) -> RuleSpec:
    """A rule on the share of a layer's units (`metric`, a ratio) that are dead or saturated:
    its signal, `drawn`, is the worst layer's share against `threshold_layer`."""
    return tensor_rule(
        severity="warning",
        signals=threshold_signal(
            drawn,
            RATIO_UNIT,
            metric,
            setting("threshold_layer", "above", suffix="%"),
            aggregate="max",
        ),
        inputs=_activation_inputs,
        **fields,
    )


DEAD_RELU = _layer_share_rule(
    contract.TENSOR_DEAD_UNIT_RATIO,
    "Dead ReLU units",
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
    parameters=DeadReluParams,
    build=_dead_relu,
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
    sat = tensor_sel(
        b, contract.TENSOR_SATURATED_UNIT_RATIO, "max", ("tanh_input", "sigmoid_input")
    )
    return one_alert(
        expr=f"max {by_collection(b)} ({sat})\n> {b.p.threshold_layer / 100:.10g}",
        units=collections(
            contract.TENSOR_SATURATED_UNIT_RATIO,
            "{{ .Value | humanizePercentage }}",
            "share of a layer's units saturated",
        ),
        summary="Most units of a tanh/sigmoid layer are saturated.",
        description=(f"had a layer with more than {b.p.threshold_layer:g}% of its units saturated"),
    )


SATURATED_ACTIVATION = _layer_share_rule(
    contract.TENSOR_SATURATED_UNIT_RATIO,
    "Saturated units",
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
    parameters=SaturatedActivationParams,
    build=_saturated,
    differences="The bounds are the training process's (SageMaker's defaults).",
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
    high = tensor_sel(b, contract.TENSOR_VARIANCE, "max", _ACTIVATION_INPUTS)
    low = tensor_sel(b, contract.TENSOR_VARIANCE, "min", _ACTIVATION_INPUTS)
    spread = tensor_sel(b, contract.TENSOR_PERCENTILE_SPREAD, "min", ("gradients",))
    since = b.sel(contract.TRAINING_LOSS_SAVES_SINCE_IMPROVEMENT, mode="train")
    early = b.sel(contract.TENSOR_LAST_SAVE_STEP)
    loss_early = b.sel(contract.TRAINING_LOSS_STEP, mode="train")
    expr = (
        f"(\n  max {b.by_job} ({high})\n  / min {b.by_job} ({low})\n  > {p.threshold:g}\n"
        f"  or\n  min {b.by_job} ({spread}) < {p.distribution_range:g}\n)\n"
        f"and {b.on_job}\nmax {b.by_job} ({early}) <= {p.steps}\n"
        f"or\nmax {b.by_job} ({since}) >= {p.patience}\n"
        f"and {b.on_job}\nmax {b.by_job} ({loss_early}) <= {p.steps}"
    )
    return one_alert(
        expr=expr,
        summary="The weights look poorly initialised.",
        description=(
            f"Job {JOB}: in its first {p.steps} steps, activation-input variances differ "
            f"across layers by more than {p.threshold:g}x, a gradient's 5-95 percentile "
            f"range is below {p.distribution_range:g}, or the loss did not improve for "
            f"{p.patience} saves (value {{{{ $value }}}})."
        ),
    )


POOR_WEIGHT_INITIALIZATION = tensor_rule(
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
    signals=threshold_signal(
        "Activation-input variance",
        NUMBER_UNIT,
        contract.TENSOR_VARIANCE,
        lambda p: Threshold(p.threshold, f"{p.threshold:g}x", "above"),
        collection="relu_input",
    ),
    differences=(
        "Layers are nn.ReLU/nn.Tanh/nn.Sigmoid modules (their inputs' variance, collections "
        "relu_input, tanh_input, sigmoid_input); percentiles are over an even sample of at most "
        "100,000 elements of each gradient; 'loss not decreasing' counts saves without an "
        "improvement over 0.01 (Overtraining's delta)."
    ),
)

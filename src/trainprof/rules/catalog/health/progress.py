"""Is the job still learning: the loss (LossNotDecreasing, Overfit, Overtraining) and the
steps (StalledTrainingRule)."""

from __future__ import annotations

import dataclasses

from trainprof.contract import metrics as contract
from trainprof.contract.durations import format_duration
from trainprof.rules import promql
from trainprof.rules.catalog._text import JOB
from trainprof.rules.catalog.health.common import (
    RANK_MODE,
    one_alert,
    ranks,
    setting,
    tensor_rule,
    threshold_signal,
    warn_process_default,
)
from trainprof.rules.model import NUMBER_UNIT, SECONDS_UNIT, Build, RuleOutput, Selects, Threshold
from trainprof.rules.params import MODE, PERCENT, param, scan_interval_param
from trainprof.rules.tensor_params import FLAG, NUMBER, REGEX, STEPS, TEXT, WHOLE

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


# SageMaker's LossNotDecreasing reads one mode's losses: EVAL's if any, else TRAIN's, else
# GLOBAL's (RULE-SEMANTICS.md section 4).
LOSS_MODES = ("eval", "train", "global")
# A firing LossNotDecreasing resolves only after this many rule evaluations in a row found
# the loss decreasing: one evaluation's noise (a lucky batch) does not resolve it and fire it
# again at the next.
HOLD_EVALUATIONS = 3


def _loss_not_decreasing(b: Build[LossNotDecreasingParams]) -> RuleOutput:
    p = b.p
    factor = 1 - p.diff_percent / 100
    equal = {"num_steps": str(p.num_steps)}

    def judged(mode: str) -> str:
        evaluated = b.sel(contract.TRAINING_LOSS_EVALUATED, mode=mode, **equal)
        baseline = b.sel(contract.TRAINING_LOSS_BASELINE, mode=mode, **equal)
        return f"{evaluated}\n>= {baseline} * {factor:.10g}"

    if p.mode:
        expr = judged(p.mode)
    else:
        parts = []
        for i, mode in enumerate(LOSS_MODES):
            part = judged(mode)
            if i:
                before = "|".join(LOSS_MODES[:i])
                b.sel(contract.TRAINING_LOSS)  # in the metric contract
                mode_matcher = promql.Matcher("mode", "=~", before)
                saved = promql.selector(contract.TRAINING_LOSS, [*b.matchers, mode_matcher])
                part = f"({part}\nunless ignoring (mode, num_steps)\n{saved})"
            parts.append(part)
        expr = "\nor\n".join(parts)
    # Held through noise: once fired, it resolves only after HOLD_EVALUATIONS evaluations in
    # a row found the loss decreasing (the `or` keeps the onset at the evaluation itself).
    scan = p.scan_interval_us / 1e6
    # the last HOLD_EVALUATIONS evaluations: half a scan short, so a range closed at its
    # start (Prometheus 2) and one open there (Prometheus 3) hold the same points
    window = format_duration((HOLD_EVALUATIONS - 0.5) * scan)
    step = format_duration(scan)
    expr = f"{expr}\nor\nmax_over_time((\n{expr}\n)[{window}:{step}])"
    return one_alert(
        expr=expr,
        units=ranks(
            contract.TRAINING_LOSS_EVALUATED,
            RANK_MODE,
            "loss",
            singular="loss",
            plural="losses (rank and mode)",
            **equal,
        ),
        # Held in its own expression (HOLD_EVALUATIONS), from the onset: no second hold.
        hold=0,
        summary="The loss is not decreasing.",
        description=(
            f"did not fall by {p.diff_percent:g}% at their latest evaluation from the loss "
            f"{p.num_steps} steps earlier"
        ),
    )


def _loss_inputs(b: Build[LossNotDecreasingParams]):
    if b.p.num_steps != 10:
        so = f" so it evaluates {b.p.num_steps} too"
        warn_process_default(b, "num_steps", "evaluates num_steps 10", so)
    return {"loss_num_steps": b.p.num_steps}


LOSS_NOT_DECREASING = tensor_rule(
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
    signals=threshold_signal(
        "Loss",
        NUMBER_UNIT,
        contract.TRAINING_LOSS,
        lambda p: Threshold(0, "previous loss", "above"),
    ),
    inputs=_loss_inputs,
    differences=(
        "Reading of `diff_percent`: the documented one, fire when "
        "`loss_s >= loss_prev x (1 - diff_percent/100)`. SageMaker's 2019 test passed only "
        "with the opposite (`loss_s >= loss_prev x (1 + diff_percent/100)`); both agree at "
        "`diff_percent` 0. "
        "`increase_threshold_percent` is accepted and not used. Without `mode`, the losses "
        "of one mode are judged, as in the original: eval's if any was logged, else "
        "train's, else global's. Once fired, the alert resolves only after 3 evaluations in "
        "a row found the loss decreasing (noise does not resolve and re-fire it); SageMaker's "
        "verdict, once IssuesFound, never went back."
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
    train = b.sel(contract.TRAINING_LOSS, mode="train")
    valid = b.sel(contract.TRAINING_LOSS, mode="eval")
    # the training step reached: the latest loss of any mode (SageMaker invoked the rule at
    # every saved step, a validation step included)
    step = f"max without (mode) ({b.sel(contract.TRAINING_LOSS_STEP)})"
    expr = (
        f"({valid} - ignoring (mode) {train})\n/ ignoring (mode) abs({train})\n"
        f"> {p.ratio_threshold:g}\nand ignoring (mode)\n{step} >= {p.start_step}"
    )
    return one_alert(
        expr=expr,
        units=ranks(
            contract.TRAINING_LOSS, what="(validation - training) / training", mode="train"
        ),
        summary="Validation loss is well above training loss.",
        description=(
            f"had a validation loss above their training loss by more than "
            f"{p.ratio_threshold:g} of it"
        ),
        for_seconds=(p.patience - 1) * p.scan_interval_us / 1e6,
    )


OVERFIT = tensor_rule(
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
    signals=threshold_signal(
        "Training and validation loss",
        NUMBER_UNIT,
        contract.TRAINING_LOSS,
        setting("ratio_threshold", "above"),
    ),
    differences=(
        "Compares the latest saved loss of each mode (the original compared means over its "
        "evaluation window). `patience` becomes a `for:` of patience - 1 scan intervals. "
        "`start_step` is compared with the step of the latest loss of any mode, as the "
        "original was invoked at every saved step, validation steps included (log eval "
        "losses with `step=` for the two to count alike)."
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
    since = contract.TRAINING_LOSS_SAVES_SINCE_IMPROVEMENT
    expr = (
        f"{b.sel(since, mode='train')} >= {p.patience_train}\n"
        f"or\n{b.sel(since, mode='eval')} >= {p.patience_validation}"
    )
    return one_alert(
        expr=expr,
        units=ranks(
            since,
            RANK_MODE,
            "saved steps without improvement",
            singular="loss",
            plural="losses (rank and mode)",
        ),
        summary="The loss stopped improving.",
        description=(
            f"did not improve by more than {p.delta:g} for {p.patience_train} (training) or "
            f"{p.patience_validation} (validation) saved steps"
        ),
    )


def _overtraining_inputs(b: Build[OvertrainingParams]):
    if b.p.delta != 0.01:
        warn_process_default(b, "delta", "counts improvements over 0.01")
    return {"loss_delta": b.p.delta}


OVERTRAINING = tensor_rule(
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
    signals=threshold_signal(
        "Saves since the loss improved",
        NUMBER_UNIT,
        contract.TRAINING_LOSS_SAVES_SINCE_IMPROVEMENT,
        setting("patience_train", "above", spec=""),
    ),
    inputs=_overtraining_inputs,
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
    step = b.sel(contract.TRAINING_LAST_STEP_TIMESTAMP_SECONDS)
    save = b.sel(contract.TENSOR_LAST_SAVE_TIMESTAMP_SECONDS)
    labels = {"action": "stop"} if b.p.stop_training_on_fire else {}
    return one_alert(
        expr=(
            f"time() - (max {b.by_job} ({step}) or max {b.by_job} ({save}))\n> {b.p.threshold:g}"
        ),
        summary="Training has stalled.",
        description=(
            f"Job {JOB}: no step ended and no tensor was saved for "
            "{{ $value | humanizeDuration }} "
            f"(threshold {b.p.threshold:g} s)."
        ),
        labels=labels,
    )


def _since_last_step(scope: Selects) -> str:
    last = scope.sel(contract.TRAINING_LAST_STEP_TIMESTAMP_SECONDS)
    return f"time() - max {scope.by_job} ({last})"


STALLED_TRAINING = tensor_rule(
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
    signals=threshold_signal(
        "Seconds since the last step",
        SECONDS_UNIT,
        _since_last_step,
        setting("threshold", "above", suffix=" s"),
    ),
    differences=(
        "Native PromQL on the last step's timestamp: `time() - last > threshold`. "
        "`stop_training_on_fire` adds the label action=stop, which the StopTraining "
        "receiver acts on like a configured `stop` rule."
    ),
)

"""The predictions against the labels: ClassImbalance and Confusion, over the confusion
counters the training process keeps (Watcher.log_predictions)."""

from __future__ import annotations

import dataclasses

from trainprof.contract import metrics as contract
from trainprof.rules.catalog._text import JOB
from trainprof.rules.catalog.health.common import (
    one_alert,
    setting,
    tensor_rule,
    threshold_signal,
)
from trainprof.rules.model import NUMBER_UNIT, Build, RuleOutput, Selects, Threshold
from trainprof.rules.params import param, scan_interval_param
from trainprof.rules.tensor_params import FLAG, NUMBER, OPTIONAL_STEPS, REGEX, TEXT, WHOLE

# --- ClassImbalance, Confusion ------------------------------------------------------------------


def _confusion_parts(
    b: Build, series: str = contract.CLASSIFICATION_SAMPLES_TOTAL
) -> tuple[str, str, str]:
    """(the job's matrix, its diagonal, the job labels) of the confusion counts `series`."""
    job = ", ".join(b.job_labels)
    m = f"sum by ({job}, label_class, predicted_class) ({b.sel(series)})"
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
    return one_alert(
        expr=f"{imbalance}\nor\n{misprediction}",
        summary="Classes are imbalanced or mostly mispredicted.",
        description=(
            f"Job {JOB}: class counts differ by a factor of {{{{ $value }}}} or a class "
            f"is mispredicted that often (thresholds {p.threshold_imbalance:g}x, "
            f"{p.threshold_misprediction:g})."
        ),
    )


def _samples_per_class(scope: Selects) -> str:
    samples = scope.sel(contract.CLASSIFICATION_SAMPLES_TOTAL)
    return f"sum by (training_job, label_class) ({samples})"


CLASS_IMBALANCE = tensor_rule(
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
    signals=threshold_signal(
        "Samples per class",
        NUMBER_UNIT,
        _samples_per_class,
        lambda p: Threshold(p.threshold_imbalance, f"{p.threshold_imbalance:g}x", "above"),
    ),
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
    m, diagonal, job = _confusion_parts(b, contract.CLASSIFICATION_SAVED_SAMPLES)
    column = f"sum by ({job}, predicted_class) ({m})"
    diag = f"sum by ({job}, predicted_class) ({diagonal})"
    diag_share = f"({diag}\nor\n{column} * 0)\n/\n{column}"
    off = f"({m}\nunless\n{diagonal})"
    off_share = f"{off}\n/ on ({job}, predicted_class) group_left\n{column}"
    expr = (
        f"min {b.by_job} ({diag_share}) < {p.min_diag:g}\n"
        f"or\nmax {b.by_job} ({off_share}) > {p.max_off_diag:g}"
    )
    return one_alert(
        expr=expr,
        summary="The confusion matrix is poor.",
        description=(
            f"Job {JOB}: a predicted class's column has a diagonal or off-diagonal "
            f"share of {{{{ $value | humanizePercentage }}}} (min_diag {p.min_diag:g}, "
            f"max_off_diag {p.max_off_diag:g})."
        ),
    )


CONFUSION = tensor_rule(
    name="Confusion",
    summary="Poor confusion matrix",
    detects=(
        "The predictions of the latest saved step, for each predicted class (column): the "
        "share of its "
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
    signals=threshold_signal(
        "Confusion matrix",
        NUMBER_UNIT,
        contract.CLASSIFICATION_SAVED_SAMPLES,
        setting("min_diag", "below"),
    ),
    differences=(
        "Each cell is normalised by its predicted column, `M[i][i] / sum_j M[j][i]` (empty "
        "columns skipped): the documented per-row formula cannot be right, since perfect "
        "10-class predictions would give 1/10 < min_diag; the column reading reproduces the "
        "original's tests. Judged on each saved step's matrix, as SageMaker invoked the "
        "rule at each saved step (ClassImbalance counts every save since the start)."
    ),
)

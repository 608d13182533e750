"""XGBoost's trees: FeatureImportanceOverweight and TreeDepth, from the XGBoost
callback's series."""

from __future__ import annotations

import dataclasses

from trainprof.contract import metrics as contract
from trainprof.rules.catalog.health.common import (
    LEGEND,
    one_alert,
    ranks,
    setting,
    tensor_rule,
    threshold_signal,
)
from trainprof.rules.model import NUMBER_UNIT, RATIO_UNIT, Build, RuleOutput, Signal, Threshold
from trainprof.rules.params import param, scan_interval_param
from trainprof.rules.tensor_params import NUMBER, REGEX, STEPS


@dataclasses.dataclass(frozen=True)
class FeatureImportanceOverweightParams:
    threshold: float = param(0.8, NUMBER, "Share of the top nfeatures above which it fires.")
    nfeatures: int = param(3, STEPS, "How many of the most important features (1-10).")
    tensor_regex: str | None = param(".*feature_importance/weight", REGEX, "Accepted.")
    scan_interval_us: int = scan_interval_param()


def _importance(b: Build[FeatureImportanceOverweightParams]) -> RuleOutput:
    p = b.p
    top = b.sel(contract.XGBOOST_FEATURE_IMPORTANCE_TOP_RATIO, top=str(p.nfeatures))
    return one_alert(
        expr=f"{top} > {p.threshold:g}",
        units=dataclasses.replace(
            ranks(contract.XGBOOST_FEATURE_IMPORTANCE_TOP_RATIO, top=str(p.nfeatures)),
            value="{{ .Value | humanizePercentage }}",
            value_text=f"importance of the top {p.nfeatures}",
        ),
        summary="A few features carry most of the importance.",
        description=(
            f"gave their top {p.nfeatures} features more than {p.threshold:g} of the importance"
        ),
    )


def _importance_check(p: FeatureImportanceOverweightParams):
    if p.nfeatures > 10:
        return (("nfeatures", f"{p.nfeatures} is above 10, the most the callback publishes"),)
    return ()


def _importance_signals(b, out, scope, _):
    """The one signal whose title and series name the parameter (`nfeatures`)."""
    n = b.p.nfeatures
    expr = scope.sel(contract.XGBOOST_FEATURE_IMPORTANCE_TOP_RATIO, top=str(n))
    line = setting("threshold", "above")(b.p)
    return (Signal(f"Importance of the top {n} features", expr, LEGEND, RATIO_UNIT, line),)


FEATURE_IMPORTANCE_OVERWEIGHT = tensor_rule(
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
    depth = b.sel(contract.XGBOOST_TREE_DEPTH)
    return one_alert(
        expr=f"{depth} < {b.p.depth}",
        units=ranks(contract.XGBOOST_TREE_DEPTH, what="deepest tree", worst="lowest"),
        summary="XGBoost trees stay shallower than expected.",
        description=(
            f"grew no tree deeper than {b.p.depth - 1:g}: splits stopped improving the loss"
        ),
    )


TREE_DEPTH = tensor_rule(
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
    signals=threshold_signal(
        "Tree depth",
        NUMBER_UNIT,
        contract.XGBOOST_TREE_DEPTH,
        lambda p: Threshold(p.depth, f"{p.depth}", "below"),
    ),
    differences=(
        "Depth is measured on the trees themselves (root at 0), not as log2 of the largest "
        "node id. The direction is undocumented; trainprof fires when trees stay shallower "
        "than `depth`. Replaying a trial reads the XGBoost hook's `trees` collection, which "
        "holds one tree per saved round (tree number = round): the depth is that of the deepest "
        "saved tree so far (live, the callback measures every tree)."
    ),
)

"""The registry: every rule of the catalog in report order (`CATALOG`), by name
(`BY_NAME`, `lookup`), and the subsets ProfilerReport and the alert routes use. Code reads
`registry.CATALOG` when it runs, so a test may extend it (tests/test_throwaway_rule.py)."""

from __future__ import annotations

from trainprof.rules.catalog.bottleneck import CPU_BOTTLENECK, IO_BOTTLENECK
from trainprof.rules.catalog.framework import (
    DATALOADER,
    MAX_INITIALIZATION_TIME,
    OVERALL_FRAMEWORK_METRICS,
    STEP_OUTLIER,
)
from trainprof.rules.catalog.gpu import (
    BATCH_SIZE,
    GPU_MEMORY_INCREASE,
    LOAD_BALANCING,
    LOW_GPU_UTILIZATION,
)
from trainprof.rules.catalog.health.activations import (
    DEAD_RELU,
    POOR_WEIGHT_INITIALIZATION,
    SATURATED_ACTIVATION,
)
from trainprof.rules.catalog.health.inputs import CHECK_INPUT_IMAGES, NLP_SEQUENCE_RATIO
from trainprof.rules.catalog.health.predictions import CLASS_IMBALANCE, CONFUSION
from trainprof.rules.catalog.health.progress import (
    LOSS_NOT_DECREASING,
    OVERFIT,
    OVERTRAINING,
    STALLED_TRAINING,
)
from trainprof.rules.catalog.health.tensors import (
    ALL_ZERO,
    EXPLODING_TENSOR,
    SIMILAR_ACROSS_RUNS,
    TENSOR_VARIANCE,
    UNCHANGED_TENSOR,
    VANISHING_GRADIENT,
    WEIGHT_UPDATE_RATIO,
)
from trainprof.rules.catalog.health.xgboost import FEATURE_IMPORTANCE_OVERWEIGHT, TREE_DEPTH
from trainprof.rules.catalog.kernels import (
    LAUNCH_BOUND_STEPS,
    MEMCPY_HEAVY_STEPS,
    NO_REDUCED_PRECISION,
)
from trainprof.rules.catalog.regression import (
    GPU_UTILIZATION_REGRESSION,
    STEP_TIME_REGRESSION,
)
from trainprof.rules.catalog.system import OVERALL_SYSTEM_USAGE
from trainprof.rules.model import RuleSpec

PROFILER_RULES: tuple[RuleSpec, ...] = (
    CPU_BOTTLENECK,
    IO_BOTTLENECK,
    LOW_GPU_UTILIZATION,
    BATCH_SIZE,
    GPU_MEMORY_INCREASE,
    LOAD_BALANCING,
    MAX_INITIALIZATION_TIME,
    STEP_OUTLIER,
    DATALOADER,
    LAUNCH_BOUND_STEPS,
    MEMCPY_HEAVY_STEPS,
    NO_REDUCED_PRECISION,
    OVERALL_SYSTEM_USAGE,
    OVERALL_FRAMEWORK_METRICS,
)
# trainprof's own rules comparing a job with a baseline run, which ProfilerReport does not
# include either (`RuleSpec.profiler_report`).
REGRESSION_RULES: tuple[RuleSpec, ...] = (STEP_TIME_REGRESSION, GPU_UTILIZATION_REGRESSION)
# The tensor rules (family "health"), which ProfilerReport does not include.
TENSOR_RULES: tuple[RuleSpec, ...] = (
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
CATALOG: tuple[RuleSpec, ...] = PROFILER_RULES + REGRESSION_RULES + TENSOR_RULES

BY_NAME = {r.name: r for r in CATALOG}
PROFILER_REPORT = "ProfilerReport"

# SageMaker rules trainprof knows of but does not implement (yet): named so a pasted
# configuration gets a clear answer instead of "unknown rule".
NOT_IMPLEMENTED: dict[str, str] = {}


def lookup(name: str) -> RuleSpec | None:
    """A rule by its SageMaker name, ignoring case (the SDK did too)."""
    if name in BY_NAME:
        return BY_NAME[name]
    folded = name.lower()
    for rule in CATALOG:
        if rule.name.lower() == folded:
            return rule
    return None


def profiler_rules() -> tuple[RuleSpec, ...]:
    """The rules ProfilerReport stands for (CATALOG may be extended, as tests do)."""
    return tuple(r for r in CATALOG if r.family != "health" and r.profiler_report)


def alerting_rules() -> tuple[RuleSpec, ...]:
    return tuple(r for r in CATALOG if r.alerting)

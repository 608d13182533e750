"""The catalog: every SageMaker Debugger profiler rule trainprof implements, in report order.

`ProfilerReport` is not an entry of its own: it stands for all of them (as it did in
SageMaker), with `<Rule>_<parameter>` overrides.

Adding a rule touches one module: write its `RuleSpec` in the family's module (bottleneck,
gpu, framework, system, kernels) and list it in `CATALOG` below. The spec carries everything:
`parameters` (a frozen dataclass of `params.param` fields), `build` (its recordings and
alerts), `signals` (what its dashboard row and report section draw, thresholds from the same
parameters), and, when it needs them, `inputs` (what exporters must count), `health`
(alerts when they do not), `state` (job-state alerts) and `reads_exporter`. The compiler,
dashboards, report, alerting routes, replay and docs pick it up; `make generate` rewrites
the artifacts. tests/test_throwaway_rule.py adds a complete rule in one test module.
"""

from __future__ import annotations

from trainprof.rules.catalog.bottleneck import CPU_BOTTLENECK, IO_BOTTLENECK
from trainprof.rules.catalog.framework import (
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
from trainprof.rules.catalog.kernels import (
    LAUNCH_BOUND_STEPS,
    MEMCPY_HEAVY_STEPS,
    NO_REDUCED_PRECISION,
)
from trainprof.rules.catalog.system import OVERALL_SYSTEM_USAGE
from trainprof.rules.model import RuleSpec

CATALOG: tuple[RuleSpec, ...] = (
    CPU_BOTTLENECK,
    IO_BOTTLENECK,
    LOW_GPU_UTILIZATION,
    BATCH_SIZE,
    GPU_MEMORY_INCREASE,
    LOAD_BALANCING,
    MAX_INITIALIZATION_TIME,
    STEP_OUTLIER,
    LAUNCH_BOUND_STEPS,
    MEMCPY_HEAVY_STEPS,
    NO_REDUCED_PRECISION,
    OVERALL_SYSTEM_USAGE,
    OVERALL_FRAMEWORK_METRICS,
)

BY_NAME = {r.name: r for r in CATALOG}
PROFILER_REPORT = "ProfilerReport"

# SageMaker rules trainprof knows of but does not implement (yet): named so a pasted
# configuration gets a clear answer instead of "unknown rule".
NOT_IMPLEMENTED = {
    "Dataloader": "the Dataloader rule is not implemented yet",
}


def lookup(name: str) -> RuleSpec | None:
    """A rule by its SageMaker name, ignoring case (the SDK did too)."""
    if name in BY_NAME:
        return BY_NAME[name]
    folded = name.lower()
    for rule in CATALOG:
        if rule.name.lower() == folded:
            return rule
    return None


def alerting_rules() -> tuple[RuleSpec, ...]:
    return tuple(r for r in CATALOG if r.alerting)

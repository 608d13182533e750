"""The catalog: every SageMaker Debugger rule trainprof implements, in report order.

The profiler rules come first; `ProfilerReport` is not an entry of its own: it stands for all
of them (as it did in SageMaker), with `<Rule>_<parameter>` overrides. The tensor rules
(family "health", `catalog.health`) follow; ProfilerReport does not include them.

Adding a rule: write its `RuleSpec` in the family's module (bottleneck, gpu, framework,
system, kernels, or one of health/) and list it in `registry.py`. The spec carries
everything: `parameters` (a frozen dataclass of `params.param` fields), `build` (its
recordings and alerts), `signals` (what its dashboard row and report section draw,
thresholds from the same parameters), and, when it needs them, `inputs` (what exporters must
count), `health` (alerts when they do not), `state` (job-state alerts), `check` (parameter
combinations) and `reads_exporter`. The compiler, dashboards, report, alerting routes,
replay and docs pick it up; `make generate` rewrites the artifacts.
tests/test_throwaway_rule.py adds a complete rule in one test module.
"""

from trainprof.rules.catalog.registry import (
    BY_NAME,
    CATALOG,
    NOT_IMPLEMENTED,
    PROFILER_REPORT,
    PROFILER_RULES,
    TENSOR_RULES,
    alerting_rules,
    lookup,
    profiler_rules,
)

__all__ = [
    "BY_NAME",
    "CATALOG",
    "NOT_IMPLEMENTED",
    "PROFILER_REPORT",
    "PROFILER_RULES",
    "TENSOR_RULES",
    "alerting_rules",
    "lookup",
    "profiler_rules",
]

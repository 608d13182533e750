"""The compare report's own queries, beside the profiling report's: in the job dashboard's
variables, so the same PromQL runs against Prometheus and over a replay.

    >>> from trainprof.rules.compiler import compile_rules
    >>> from trainprof.rules.config import default_config
    >>> q = compare_queries(compile_rules(default_config()))["compare.step_count"]
    >>> q.expr.split("{")[0], q.expr.split("}")[1], q.over_time
    ('sum(last_over_time(trainprof_training_step_duration_seconds_count', '[$__range]))', False)

Counters are read at their last value in the range (`last_over_time`), not as an
`increase`: a run's training processes start their counters at zero, so the last value is
the whole run's, steps before the first scrape included.
"""

from __future__ import annotations

from trainprof.contract import metrics as contract
from trainprof.dashboards import exprs as x
from trainprof.dashboards.queries import JOB_VARIABLES, RANGE, RATE_INTERVAL, Scope
from trainprof.report.queries import ReportQuery
from trainprof.rules.compiler import Compiled

STEP = contract.TRAINING_STEP_DURATION_SECONDS
# Step-time statistics drawn over time: their spread within a run is its noise.
OVER_TIME_QUANTILES = ("0.5", "0.95")


def compare_queries(compiled: Compiled) -> dict[str, ReportQuery]:
    """name -> query of everything the comparison reads that the report does not."""
    scope = Scope(compiled.config, JOB_VARIABLES)
    total, count = scope.sel(STEP + "_sum"), scope.sel(STEP + "_count")
    buckets = scope.sel(STEP + "_bucket")
    q = {
        "compare.step_seconds": ReportQuery(f"sum(last_over_time({total}[{RANGE}]))"),
        "compare.step_count": ReportQuery(f"sum(last_over_time({count}[{RANGE}]))"),
        "compare.step_buckets": ReportQuery(f"sum by (le) (last_over_time({buckets}[{RANGE}]))"),
        "compare.step_mean": ReportQuery(x.step_mean(scope), True),
        "compare.samples": ReportQuery(
            f"sum(last_over_time({scope.sel(contract.TRAINING_SAMPLES_TOTAL)}[{RANGE}]))"
        ),
        "compare.gpu": ReportQuery(
            x.job_mean(scope, contract.GPU_UTILIZATION_SAMPLED_RATIO), True, "GPU utilization"
        ),
        "compare.gpu_memory_peak": ReportQuery(
            f"max by (node, gpu) (max_over_time("
            f"{scope.sel(contract.GPU_MEMORY_USED_BYTES)}[{RANGE}]))",
            legend=x.GPU_LEGEND,
        ),
        "compare.gpu_memory_total": ReportQuery(
            f"max by (node, gpu) (max_over_time("
            f"{scope.sel(contract.GPU_MEMORY_TOTAL_BYTES)}[{RANGE}]))",
            legend=x.GPU_LEGEND,
        ),
    }
    for quantile in OVER_TIME_QUANTILES:
        q[f"compare.step_p{float(quantile) * 100:g}"] = ReportQuery(
            f"histogram_quantile({quantile}, sum by (le) (rate({buckets}[{RATE_INTERVAL}])))", True
        )
    return q

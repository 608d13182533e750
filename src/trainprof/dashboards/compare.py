"""The compare dashboard: two jobs (or two runs of one job name) overlaid, as
`trainprof compare` shows them in a file.

Variables: `job_a` and `job_b` (training_job), and `a_offset`, how long before B's run A's
ran: with the same job in both, an offset of the time between two runs overlays the earlier
run on the later one ("the same time" compares two jobs that ran together). Every A query reads
its series that long ago (`offset $a_offset`).

Stat panels give B against A over the dashboard's range: step time and step rate as a
ratio, utilisations as a difference in percentage points. The job dashboard links here with
its variables.
"""

from __future__ import annotations

import re

from trainprof.contract import metrics as contract
from trainprof.contract.names import COMPARE_DASHBOARD, JOB_DASHBOARD, JOB_LABEL
from trainprof.dashboards import exprs as x
from trainprof.dashboards import panels as ui
from trainprof.dashboards.panels import target
from trainprof.dashboards.queries import RANGE, Scope, presence
from trainprof.rules.compiler import Compiled
from trainprof.rules.config import RulesConfig

UID = COMPARE_DASHBOARD.uid
TITLE = COMPARE_DASHBOARD.title
SLUG = COMPARE_DASHBOARD.slug
SOURCE = "src/trainprof/dashboards/compare.py"
SIDES = ("a", "b")
OFFSET = "a_offset"
_JOB = f'{JOB_LABEL}="${JOB_LABEL}"'
# A selector as Scope writes it (always with braces: the job is matched), and the range
# that may follow it.
_SELECTOR = re.compile(
    r"""[A-Za-z_:][A-Za-z0-9_:]*\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}(\[[^\]:]+\])?"""
)


def side(expr: str, which: str) -> str:
    """`expr`, written for the job dashboard's `$training_job`, for run A or B: its job
    variable, and for A every selector `offset $a_offset`.

    >>> job = 'training_job="$training_job"'
    >>> print(side(f"rate(x{{{job}}}[5m]) / y{{{job}}}", "a"))
    rate(x{training_job="$job_a"}[5m] offset $a_offset) / y{training_job="$job_a"} offset $a_offset
    """
    expr = expr.replace(_JOB, f'{JOB_LABEL}="$job_{which}"')
    if which == "a":
        expr = _SELECTOR.sub(lambda m: f"{m.group(0)} offset ${OFFSET}", expr)
    return expr


def _both(title: str, make, unit: str, legend: str = "", **kw) -> ui.TimeSeries:
    """A time series of the same query for A and B, overlaid."""
    return ui.timeseries(
        title,
        [
            target(side(make, s), f"{s.upper()}: $job_{s}{' ' + legend if legend else ''}")
            for s in SIDES
        ],
        unit=unit,
        **kw,
    )


def _b_against_a(title: str, expr: str, description: str, relative: bool = True) -> ui.Stat:
    """B's `expr` against A's: B / A - 1 (`relative`), else B - A."""
    b, a = side(expr, "b"), side(expr, "a")
    query = f"{b}\n/\n{a}\n- 1" if relative else f"{b}\n-\n{a}"
    return ui.stat(title, [target(query)], unit=ui.RATIO, decimals=1, w=4, description=description)


def _utilization(scope: Scope, title: str, metric: str, max_value: int | None = 1) -> ui.TimeSeries:
    """A and B's mean of a sampled ratio (`metric`), on an axis from 0 (to `max_value`)."""
    return _both(title, x.job_mean(scope, metric), ui.RATIO, min_value=0, max_value=max_value, w=8)


def _over_range(scope: Scope, histogram: str) -> str:
    """A sampled ratio's mean over the dashboard's range, every sample of the job."""
    return x.job_mean(scope, histogram, over=RANGE)


def differences_row(scope: Scope) -> ui.Row:
    step = contract.TRAINING_STEP_DURATION_SECONDS
    s = scope.sel
    total, count = s(step + "_sum"), s(step + "_count")
    step_mean = f"sum(increase({total}[{RANGE}]))\n/\nsum(increase({count}[{RANGE}]))"
    steps = f"sum(increase({s(contract.TRAINING_STEPS_TOTAL)}[{RANGE}]))"
    over_range = "over the dashboard's range"
    firing = f"count({x.firing_alerts(scope)}) or vector(0)"
    return ui.row(
        "B against A",
        [
            _b_against_a(
                "Step time, B against A",
                step_mean,
                f"B's mean step time over A's, less one, {over_range}: +10% is B 10% slower.",
            ),
            _b_against_a(
                "Steps, B against A",
                steps,
                f"B's training steps over A's, less one, {over_range} (A read ${OFFSET} earlier).",
            ),
            _b_against_a(
                "GPU utilization, B minus A",
                _over_range(scope, contract.GPU_UTILIZATION_SAMPLED_RATIO),
                f"In percentage points, every sample of every GPU of each job, {over_range}.",
                relative=False,
            ),
            _b_against_a(
                "CPU utilization, B minus A",
                _over_range(scope, contract.CPU_UTILIZATION_SAMPLED_RATIO),
                f"In percentage points, the nodes' cores, {over_range}.",
                relative=False,
            ),
            _b_against_a(
                "GPU memory used, B minus A",
                _over_range(scope, contract.GPU_MEMORY_USED_SAMPLED_RATIO),
                f"In percentage points of each GPU's memory, {over_range}.",
                relative=False,
            ),
            ui.stat(
                "Alerts firing, A and B",
                [target(side(firing, s), f"{s.upper()}") for s in SIDES],
                threshold=1,
                w=4,
                description="Alerts of each job firing at the end of the range.",
            ),
        ],
    )


def overlaid_row(scope: Scope) -> ui.Row:
    return ui.row(
        "A and B overlaid",
        [
            _both("Mean step time", x.step_mean(scope), ui.SECONDS, w=12),
            _both(
                "Step time p50",
                "histogram_quantile(0.5, sum by (le) (rate("
                f"{scope.sel(contract.TRAINING_STEP_DURATION_SECONDS + '_bucket')}"
                "[$__rate_interval])))",
                ui.SECONDS,
                w=12,
            ),
            _both("Step rate", x.step_rate(scope), ui.STEPS_PER_SECOND, w=8),
            _utilization(
                scope, "GPU utilization (the job's GPUs)", contract.GPU_UTILIZATION_SAMPLED_RATIO
            ),
            _utilization(
                scope, "CPU utilization (the job's nodes)", contract.CPU_UTILIZATION_SAMPLED_RATIO
            ),
            _utilization(scope, "GPU memory used", contract.GPU_MEMORY_USED_SAMPLED_RATIO),
            _utilization(scope, "Host memory used", contract.MEMORY_USED_SAMPLED_RATIO),
            _utilization(scope, "I/O wait", contract.CPU_IOWAIT_SAMPLED_RATIO, max_value=None),
            ui.bargauge(
                "Seconds per step in each phase",
                [
                    target(side(x.phase_seconds_per_step(scope), s), f"{s.upper()} {{{{phase}}}}")
                    for s in SIDES
                ],
                unit=ui.SECONDS,
                w=24,
                description="Over the dashboard's range: where each run's step time went.",
            ),
        ],
    )


def variables(config: RulesConfig) -> list[ui.Variable]:
    job = presence(config.source)
    in_namespace = f'{job[:-1]}, namespace=~"$namespace"}}'
    # Prometheus refuses `offset 0s`: "the same time" is a millisecond, which no scrape
    # interval resolves.
    offset = ui.custom_variable(
        OFFSET,
        [
            ("the same time", "1ms"),
            ("1 hour", "1h"),
            ("6 hours", "6h"),
            ("1 day", "1d"),
            ("2 days", "2d"),
            ("7 days", "7d"),
        ],
        label="A ran earlier by",
    )
    return [
        ui.datasource_variable(),
        ui.query_variable(
            "namespace", f"label_values({job}, namespace)", label="Namespace", include_all=True
        ),
        ui.query_variable("job_a", f"label_values({in_namespace}, {JOB_LABEL})", label="Job A"),
        ui.query_variable("job_b", f"label_values({in_namespace}, {JOB_LABEL})", label="Job B"),
        offset,
    ]


def dashboard(config: RulesConfig, compiled: Compiled | None = None) -> ui.Dashboard:
    """The compare dashboard (`compiled` unused: it reads no recording)."""
    scope = Scope(config, ("namespace", JOB_LABEL))
    return ui.dashboard(
        TITLE,
        UID,
        f"Code generated by make generate. DO NOT EDIT. Edit {SOURCE}.\n"
        "Two training jobs, or two runs of one, overlaid: what changed between them.",
        [differences_row(scope), overlaid_row(scope)],
        variables(config),
        tags=["trainprof"],
        links=[
            ui.link_with(
                f"Job {s.upper()}",
                JOB_DASHBOARD.url() + f"?var-training_job=$job_{s}&var-namespace=$namespace",
                f"The job dashboard of job {s.upper()}",
            )
            for s in SIDES
        ],
    )

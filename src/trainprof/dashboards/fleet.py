"""The fleet overview: every running job, the rules firing per job, idle GPU-hours and the
worst stragglers. A job's name links to its per-job dashboard."""

from __future__ import annotations

from trainprof.contract import metrics as contract
from trainprof.contract.durations import format_duration
from trainprof.contract.names import FLEET_DASHBOARD, JOB_DASHBOARD, JOB_LABEL
from trainprof.dashboards import exprs as x
from trainprof.dashboards import panels as ui
from trainprof.dashboards.panels import target
from trainprof.dashboards.queries import FLEET_VARIABLES, RANGE, RATE_INTERVAL, Scope, presence
from trainprof.rules.compiler import Compiled, compile_rules
from trainprof.rules.config import RulesConfig

UID = FLEET_DASHBOARD.uid
TITLE = FLEET_DASHBOARD.title
SLUG = FLEET_DASHBOARD.slug
SOURCE = "src/trainprof/dashboards/fleet.py"
_UTIL = contract.GPU_UTILIZATION_SAMPLED_RATIO


def idle_bound(compiled: Compiled) -> float:
    """The utilization below which a GPU counts as idle: the rules' (CPUBottleneck's
    `gpu_threshold`, SageMaker's definition of a starved GPU; 10 % without it), rounded
    down to a bucket bound of the utilization histogram (counted samples are at or below
    it)."""
    percent = compiled.gpu_idle_percent(default=10)
    return max(b for b in contract.UTILIZATION_BUCKETS if b <= percent / 100)


def _job_link(field: str = JOB_LABEL) -> list[dict]:
    url = (
        JOB_DASHBOARD.url() + "?var-training_job=${__data.fields.training_job}"
        "&var-namespace=${__data.fields.namespace}&${__url_time_range}"
    )
    return [
        {
            "matcher": {"id": "byName", "options": field},
            "properties": [
                {"id": "links", "value": [{"title": "Open the job's dashboard", "url": url}]}
            ],
        }
    ]


def _job_mean(scope: Scope, by_job: str, over: str = RATE_INTERVAL) -> str:
    """Each job's mean GPU utilization over `over`, every sample counted."""
    if x.gauge(scope, _UTIL) is not None:
        return f"avg {by_job} ({x.mean(scope, _UTIL, over=over)})"
    s = scope.sel
    return (
        f"sum {by_job} (rate({s(_UTIL + '_sum')}[{over}]))\n/\n"
        f"sum {by_job} (rate({s(_UTIL + '_count')}[{over}]))"
    )


def dashboard(config: RulesConfig, compiled: Compiled | None = None) -> ui.Dashboard:
    """The fleet dashboard; `compiled` is `config` compiled, if the caller has it already."""
    scope = Scope(config, FLEET_VARIABLES)
    s = scope.sel
    jl = ", ".join(config.job_labels)
    by_job = f"by ({jl})"
    bound = idle_bound(compiled or compile_rules(config))
    g = x.gauge(scope, _UTIL)
    if g is None:
        interval = s(contract.SAMPLER_INTERVAL_SECONDS)
        idle = s(_UTIL + "_bucket", le=contract.bucket_label(bound))
        idle_hours = (
            f"sum {by_job} (\n  increase({idle}[{RANGE}])\n"
            f"  * ignoring (gpu, uuid, le) group_left\n  {interval}\n) / 3600"
        )
        gpu_series = s(_UTIL + "_count")
    else:
        # dcgm-exporter's gauges: each scrape at or below the bound is a scrape interval idle.
        step = format_duration(config.scrape_interval)
        idle_hours = (
            f"sum {by_job} (\n  sum_over_time(({g} <= bool {bound:g})[{RANGE}:{step}])\n) "
            f"* {config.scrape_interval:g} / 3600"
        )
        gpu_series = g
    gpus = f"count {by_job} ({gpu_series})"
    util = _job_mean(scope, by_job, RANGE)
    steps = s(contract.TRAINING_STEPS_TOTAL)
    step_rate = f"sum {by_job} (rate({steps}[{RATE_INTERVAL}]))"
    firing = s("ALERTS", alertstate="firing")
    alerts_by_job = f"count {by_job} ({firing})"
    ranks = f"count {by_job} (count by ({jl}, rank) ({steps}))"
    nodes = f"count {by_job} (count by ({jl}, node) ({x.node_series(scope, training_api=False)}))"
    durations = s(contract.TRAINING_STEP_DURATION_SECONDS + "_sum")
    counts = s(contract.TRAINING_STEP_DURATION_SECONDS + "_count")
    mean_step = f"rate({durations}[{RANGE}]) / rate({counts}[{RANGE}])"
    stragglers = (
        f"topk(10,\n  {mean_step}\n  / on ({jl}, mode) group_left\n"
        f"  quantile by ({jl}, mode) (0.5, {mean_step})\n)"
    )
    jobs = [
        target(nodes, instant=True, fmt="table", ref="nodes"),
        target(gpus, instant=True, fmt="table", ref="gpus"),
        target(ranks, instant=True, fmt="table", ref="ranks"),
        target(step_rate, instant=True, fmt="table", ref="step_rate"),
        target(util, instant=True, fmt="table", ref="gpu_util"),
        target(f"{alerts_by_job}", instant=True, fmt="table", ref="alerts"),
        target(idle_hours, instant=True, fmt="table", ref="idle"),
    ]
    rows = [
        ui.row(
            "Fleet",
            [
                ui.stat(
                    "Running jobs",
                    [target(f"count(count {by_job} ({x.node_series(scope)}))")],
                    w=6,
                    description="Jobs with an exporter or a training process scraped now.",
                ),
                ui.stat("GPUs", [target(f"count({gpu_series})")], w=6),
                ui.stat(
                    "Alerts firing", [target(f"count({firing}) or vector(0)")], threshold=1, w=6
                ),
                ui.stat(
                    f"Idle GPU-hours (below {bound:.0%})",
                    [target(f"sum({idle_hours})")],
                    decimals=1,
                    w=6,
                    description="GPU time spent at or below the idle threshold over the "
                    "range: CPUBottleneck's gpu_threshold.",
                ),
                ui.table(
                    "Jobs",
                    jobs,
                    h=10,
                    sort_by="Idle GPU-hours",
                    transformations=ui.merged(
                        {
                            "Value #nodes": "Nodes",
                            "Value #gpus": "GPUs",
                            "Value #ranks": "Ranks",
                            "Value #step_rate": "Steps/s",
                            "Value #gpu_util": "Mean GPU utilization",
                            "Value #alerts": "Alerts firing",
                            "Value #idle": "Idle GPU-hours",
                        }
                    ),
                    overrides=_job_link()
                    + [
                        {
                            "matcher": {"id": "byName", "options": "Mean GPU utilization"},
                            "properties": [{"id": "unit", "value": ui.RATIO}],
                        }
                    ],
                ),
            ],
        ),
        ui.row(
            "Rules and waste",
            [
                ui.table(
                    "Rules firing per job",
                    [
                        target(
                            f"count by ({jl}, rule, severity) ({firing})", instant=True, fmt="table"
                        )
                    ],
                    w=12,
                    sort_by="Alerts firing",
                    overrides=_job_link(),
                    transformations=[ui.organize({"Value": "Alerts firing"})],
                ),
                ui.bargauge(
                    "Idle GPU-hours per job",
                    [target(idle_hours, "{{training_job}}", instant=True)],
                    w=12,
                ),
                ui.table(
                    "Worst stragglers (mean step time / the job's median rank)",
                    [target(stragglers, instant=True, fmt="table")],
                    w=12,
                    sort_by="Slower than the median by",
                    overrides=_job_link(),
                    description="Ranks whose mean step time over the range is furthest above "
                    "their job's median rank: 1.5 means 50 % slower.",
                    transformations=[
                        ui.organize(
                            {"Value": "Slower than the median by"},
                            hide=("Time", "instance", "job", "local_rank"),
                        )
                    ],
                ),
                ui.timeseries(
                    "GPU utilization per job",
                    [
                        target(
                            _job_mean(scope, by_job),
                            "{{training_job}}",
                        )
                    ],
                    unit=ui.RATIO,
                    min_value=0,
                    max_value=1,
                    w=12,
                ),
            ],
        ),
    ]
    variables = [
        ui.datasource_variable(),
        ui.query_variable(
            "namespace",
            f"label_values({presence(config.source)}, namespace)",
            label="Namespace",
            multi=True,
            include_all=True,
        ),
    ]
    return ui.dashboard(
        TITLE,
        UID,
        f"Code generated by make generate. DO NOT EDIT. Edit {SOURCE}.\n"
        "Every training job Prometheus sees: rules firing, idle GPU-hours, stragglers.",
        rows,
        variables,
        tags=["trainprof"],
        links=[
            ui.link_to("Job dashboard", JOB_DASHBOARD.uid, JOB_DASHBOARD.slug, "One job in detail")
        ],
    )

"""The per-job dashboard: SageMaker's profiling report as Grafana rows.

Rows, in the report's order: Training job summary, System usage statistics, Framework metrics
summary, Rules summary, the SageMaker Profiler UI's views, its GPU kernel views (from the
kernel profile windows), then one collapsed row per
alerting rule with the series it watches and its threshold. Alerts link here
(`dashboard_url`, uid `trainprof-job`) with `var-training_job` and `var-namespace` set.
"""

from __future__ import annotations

from trainprof.contract import metrics as contract
from trainprof.contract.names import COMPARE_DASHBOARD, FLEET_DASHBOARD, JOB_DASHBOARD, JOB_LABEL
from trainprof.dashboards import exprs as x
from trainprof.dashboards import panels as ui
from trainprof.dashboards.alerts import catalog_rows, state_now, times_triggered
from trainprof.dashboards.kernels import kernels_row
from trainprof.dashboards.panels import target
from trainprof.dashboards.queries import JOB_VARIABLES, RANGE, RATE_INTERVAL, Scope, presence
from trainprof.rules.compiler import Compiled, compile_rules
from trainprof.rules.config import RuleInstance, RulesConfig
from trainprof.rules.job_alerts import Affected

UID = JOB_DASHBOARD.uid
TITLE = JOB_DASHBOARD.title  # the alerts' dashboard_url names its slug
SLUG = JOB_DASHBOARD.slug
SOURCE = "src/trainprof/dashboards/job.py"


# --- rows ------------------------------------------------------------------------------------


def summary_row(scope: Scope, compiled: Compiled) -> ui.Row:
    return ui.row(
        "Training job summary",
        [
            ui.stat(
                "Start",
                [target(x.start_ms(scope))],
                unit=ui.TIMESTAMP_MS,
                w=6,
                description="When the job's first training process started.",
            ),
            ui.stat(
                "Time to first step",
                [target(x.initialization(scope, compiled))],
                unit=ui.DURATION,
                description="From the first process start to the first training step "
                "(MaxInitializationTime watches it).",
            ),
            ui.stat(
                "Elapsed",
                [target(x.elapsed(scope))],
                unit=ui.DURATION,
                description="From start to the latest scrape; without the training API, "
                "how long the exporters have sampled.",
            ),
            ui.stat("Steps", [target(x.steps_by_mode(scope), "{{mode}}")], w=4),
            ui.stat(
                "Step rate",
                [target(x.step_rate(scope))],
                unit=ui.STEPS_PER_SECOND,
                graph=True,
                decimals=2,
                w=3,
            ),
            ui.stat(
                "Rules firing",
                [target(f"count({x.firing_alerts(scope)}) or vector(0)")],
                threshold=1,
                w=3,
                description="Alerts of this job firing now (see Rules summary).",
            ),
            ui.stat("Nodes", [target(x.node_count(scope))], w=3),
            ui.stat("GPUs", [target(x.gpu_count(scope))], w=3),
            ui.stat("Ranks", [target(x.rank_count(scope))], w=3),
            ui.timeseries(
                "Step rate per rank",
                [target(x.step_rate(scope, by="rank, mode"), "rank {{rank}} {{mode}}")],
                unit=ui.STEPS_PER_SECOND,
                w=15,
                h=6,
            ),
        ],
    )


def _sampled_ratio(
    scope: Scope, title: str, metric: str, legend: str, max_value: int | None = 1
) -> ui.TimeSeries:
    """The mean of a sampled ratio (`metric`) per `legend`, on an axis from 0 (to `max_value`)."""
    return ui.timeseries(
        title,
        [target(x.mean(scope, metric), legend)],
        unit=ui.RATIO,
        min_value=0,
        max_value=max_value,
        w=8,
    )


def system_row(scope: Scope, compiled: Compiled) -> ui.Row:
    network = [
        target(x.network(scope, compiled, d), f"{{{{node}}}} {d}") for d in ("receive", "transmit")
    ]
    gpu = x.GPU_LEGEND
    return ui.row(
        "System usage statistics",
        [
            _sampled_ratio(
                scope,
                "CPU utilization (average of the cores)",
                contract.CPU_UTILIZATION_SAMPLED_RATIO,
                "{{node}}",
            ),
            _sampled_ratio(scope, "GPU utilization", contract.GPU_UTILIZATION_SAMPLED_RATIO, gpu),
            _sampled_ratio(scope, "GPU memory used", contract.GPU_MEMORY_USED_SAMPLED_RATIO, gpu),
            _sampled_ratio(
                scope,
                "I/O wait (average of the cores)",
                contract.CPU_IOWAIT_SAMPLED_RATIO,
                "{{node}}",
                max_value=None,
            ),
            _sampled_ratio(
                scope, "Host memory used", contract.MEMORY_USED_SAMPLED_RATIO, "{{node}}"
            ),
            ui.timeseries("Network", network, unit=ui.BYTES_PER_SECOND, w=8),
            system_usage_table(scope, compiled),
        ],
    )


def system_usage_table(scope: Scope, compiled: Compiled) -> ui.Table:
    """OverallSystemUsage: per node and resource, p50/p95/p99 since the job started."""
    queries = [
        target(
            x.system_usage_quantile(scope, compiled, q),
            instant=True,
            fmt="table",
            ref=f"p{float(q) * 100:g}",
        )
        for q in x.QUANTILES
    ]
    return ui.table(
        "Overall system usage (p50 / p95 / p99 since the job started)",
        queries,
        unit=ui.RATIO,
        h=9,
        sort_by="node",
        descending=False,
        description="SageMaker's OverallSystemUsage: percentiles of every sample since the "
        "exporter started (GPU percentiles pool the node's GPUs).",
        transformations=ui.merged(
            {"Value #p50": "p50", "Value #p95": "p95", "Value #p99": "p99"},
            hide=("Time", "quantile", "__name__", "instance", "job", JOB_LABEL, "namespace"),
            order=("node", "resource", "Value #p50", "Value #p95", "Value #p99"),
        ),
    )


def framework_row(scope: Scope, compiled: Compiled) -> ui.Row:
    return ui.row(
        "Framework metrics summary",
        [
            ui.heatmap(
                "Step duration",
                target(x.step_buckets(scope, RATE_INTERVAL), "{{le}}", fmt="heatmap"),
                w=12,
            ),
            ui.bargauge(
                "Step duration histogram (whole range)",
                [target(x.step_buckets(scope, RANGE), "{{le}}", instant=True, fmt="heatmap")],
                w=12,
                vertical=True,
                description="Steps per duration bucket (upper bound) over the dashboard's range.",
            ),
            ui.timeseries(
                "Step duration percentiles",
                [
                    target(x.step_quantile(scope, q), f"p{float(q) * 100:g} {{{{mode}}}}")
                    for q in x.STEP_QUANTILES
                ],
                unit=ui.SECONDS,
                w=12,
            ),
            ui.piechart(
                "Phase breakdown (since start)",
                [target(x.job_phase_share(scope, compiled), "{{phase}}", instant=True)],
                w=6,
                description="SageMaker's OverallFrameworkMetrics: each phase's share of the "
                "training loop, all ranks together.",
            ),
            ui.piechart(
                "Step time per mode",
                [target(x.job_mode_share(scope, compiled), "{{mode}}", instant=True)],
                w=6,
            ),
            ui.timeseries(
                "Dataloader share per rank",
                [target(x.dataloader_share(scope), "rank {{rank}}")],
                unit=ui.RATIO,
                min_value=0,
                max_value=1,
                w=12,
                description="Time waiting for the next batch as a share of the loop: high means "
                "the input pipeline holds the GPUs back (see CPUBottleneck).",
            ),
            ui.table(
                "Phase share per rank (since start)",
                [target(x.rank_phase_share(scope, compiled), instant=True, fmt="table")],
                unit=ui.RATIO,
                w=12,
                transformations=[
                    {
                        "id": "groupingToMatrix",
                        "options": {
                            "columnField": "phase",
                            "rowField": "rank",
                            "valueField": "Value",
                        },
                    }
                ],
            ),
        ],
    )


def rules_summary_row(scope: Scope, compiled: Compiled) -> ui.Row:
    rules = compiled.alerting
    firing_by_rule = f"count by (rule) ({x.firing_alerts(scope)})"
    return ui.row(
        "Rules summary",
        [
            ui.table(
                "Rules summary",
                [
                    target(catalog_rows(rules), instant=True, fmt="table", ref="catalog"),
                    target(
                        times_triggered(scope, rules), instant=True, fmt="table", ref="triggered"
                    ),
                    target(state_now(scope, rules), instant=True, fmt="table", ref="state"),
                ],
                h=14,
                sort_by="Times triggered",
                description="Every profiler rule: what it detects, what to do, how often its alert "
                "started firing in the dashboard's range, and its state now.",
                transformations=[
                    {"id": "joinByField", "options": {"byField": "rule", "mode": "outer"}},
                    ui.organize(
                        {
                            "rule": "Rule",
                            "severity": "Severity",
                            "description": "Description",
                            "recommendation": "Recommendation",
                            "Value #triggered": "Times triggered",
                            "Value #state": "State now",
                        },
                        hide=("Time", "Time 1", "Time 2", "Time 3", "Value #catalog"),
                        order=(
                            "rule",
                            "severity",
                            "description",
                            "recommendation",
                            "Value #triggered",
                            "Value #state",
                        ),
                    ),
                ],
                overrides=[
                    _override(
                        "State now",
                        [
                            {"id": "mappings", "value": ui.STATE_MAPPINGS},
                            {"id": "custom.cellOptions", "value": {"type": "color-background"}},
                            {"id": "custom.width", "value": 100},
                        ],
                    ),
                    _override("Times triggered", [{"id": "custom.width", "value": 130}]),
                    _override("Rule", [{"id": "custom.width", "value": 190}]),
                    _override("Severity", [{"id": "custom.width", "value": 90}]),
                    _override(
                        "Description",
                        [{"id": "custom.cellOptions", "value": {"type": "auto", "wrapText": True}}],
                    ),
                    _override(
                        "Recommendation",
                        [{"id": "custom.cellOptions", "value": {"type": "auto", "wrapText": True}}],
                    ),
                ],
            ),
            ui.timeseries(
                "Alerts firing per rule",
                [target(firing_by_rule, "{{rule}}")],
                bars=True,
                stacked=True,
                w=24,
                h=6,
            ),
        ],
    )


def _override(field: str, properties: list[dict]) -> dict:
    return {"matcher": {"id": "byName", "options": field}, "properties": properties}


def profiler_views_row(scope: Scope, compiled: Compiled) -> ui.Row:
    """The SageMaker Profiler UI's views: active time, utilization per node, step time
    distribution per rank, per-annotation durations."""
    return ui.row(
        "Profiler views",
        collapsed=True,
        panels=[
            ui.bargauge(
                "GPU active time",
                [target(x.gpu_busy_seconds(scope), x.GPU_LEGEND, instant=True)],
                unit=ui.DURATION,
                w=12,
                description="Seconds a kernel ran on each GPU over the range (utilization "
                "summed over every sample x the sampling interval).",
            ),
            ui.bargauge(
                "CPU active time",
                [target(x.cpu_busy_seconds(scope), "{{node}}", instant=True)],
                unit=ui.DURATION,
                w=12,
                description="Core-seconds the CPUs were busy over the range.",
            ),
            ui.timeseries(
                "Utilization on $node",
                [
                    target(x.mean(scope, contract.CPU_UTILIZATION_SAMPLED_RATIO), "CPU"),
                    target(
                        x.mean(scope, contract.GPU_UTILIZATION_SAMPLED_RATIO, by="gpu"),
                        "GPU {{gpu}}",
                    ),
                ],
                unit=ui.RATIO,
                min_value=0,
                max_value=1,
                w=12,
                repeat="node",
            ),
            ui.timeseries(
                "Step time per rank (p50 and p99)",
                [
                    target(
                        x.step_quantile(scope, q, by="rank"),
                        f"rank {{{{rank}}}} p{float(q) * 100:g}",
                    )
                    for q in ("0.5", "0.99")
                ],
                unit=ui.SECONDS,
                w=12,
            ),
            ui.table(
                "Per-annotation durations",
                [
                    target(x.phase_seconds(scope), instant=True, fmt="table", ref="total"),
                    target(
                        x.phase_seconds_per_step(scope), instant=True, fmt="table", ref="per_step"
                    ),
                ],
                unit=ui.SECONDS,
                w=12,
                sort_by="Total",
                description="Time in each phase (trainprof.phase annotations) over the range, in "
                "total and per step.",
                transformations=ui.merged(
                    {
                        "phase": "Phase",
                        "Value #total": "Total",
                        "Value #per_step": "Per step",
                    }
                ),
            ),
        ],
    )


def rule_row(scope: Scope, compiled: Compiled, instance: RuleInstance) -> ui.Row:
    """One alerting rule: its state, how often it triggered, and each signal it compares
    with its threshold."""
    spec = instance.spec
    runbook = (f"Runbook: {spec.name}", f"{compiled.config.runbook_url}#{spec.name.lower()}")
    described = f"{spec.detects}\n\nRecommendation: {spec.recommendation}"
    signals = compiled.signals(instance, scope)
    width = 16 if len(signals) == 1 else 8
    panels = [
        ui.stat(
            "State now",
            [target(state_now(scope, [instance], by=""))],
            mappings=ui.STATE_MAPPINGS,
            w=4,
            h=4,
            description=described,
        ),
        ui.stat(
            "Times triggered",
            [target(times_triggered(scope, [instance], by=""))],
            w=4,
            h=4,
            threshold=1,
            description="Times the alert started firing in the dashboard's range.",
        ),
    ]
    for signal in signals:
        t = signal.threshold
        panels.append(
            ui.timeseries(
                signal.title,
                [target(signal.expr, signal.legend)],
                unit=signal.unit,
                threshold=t.value,
                fires=t.fires,
                w=width,
                h=8,
                links=[runbook],
                description=f"{described}\n\nThe dashed line is {t.text}; the rule fires "
                f"{t.fires} it.",
            )
        )
    found = [a for a in compiled.affected_of(spec.name) if a.units is not None]
    if found:
        panels.append(
            ui.table(
                "Found in the range",
                [
                    target(_found(scope, a), instant=True, fmt="table", ref=f"found{i}")
                    for i, a in enumerate(found)
                ],
                w=24,
                h=5,
                transformations=[
                    {"id": "merge", "options": {}},
                    ui.organize(
                        {"Value": "Worst"}, hide=("Time", "__name__", "rule", "severity", "job")
                    ),
                ],
                description="What the rule's alert counted: the units its condition held "
                "for in the dashboard's range, each with its worst value. The alert itself is "
                "one per job and reason.",
            )
        )
    return ui.row(f"{spec.name}: {spec.summary}", panels, collapsed=True)


def _found(scope: Scope, affected: Affected) -> str:
    """An alert's `affected` series over the range, each at its worst."""
    units = affected.units
    over = "max_over_time" if units is None or units.worst == "highest" else "min_over_time"
    own = {"severity": affected.severity, **affected.labels}
    return f"{over}({scope.sel(affected.record, **own)}[{RANGE}])"


# --- the dashboard ---------------------------------------------------------------------------


def variables(config: RulesConfig | None = None) -> list[ui.Variable]:
    """The job dashboard's variables. With a node-wide exporter (`gpu_attribution:
    assignment`) its series carry no job: "All" nodes then means the job's nodes (not `.*`,
    every node of the cluster), and the GPUs are the ones the job's ranks hold."""
    job = presence(config.source if config is not None else ("trainprof",))
    in_job = 'training_job="$training_job", namespace=~"$namespace"'
    node_wide = config is not None and config.gpu_attribution == "assignment"
    gpus = (
        contract.GPU_ASSIGNMENT_INFO
        if node_wide
        else contract.GPU_UTILIZATION_SAMPLED_RATIO + "_count"
    )
    return [
        ui.datasource_variable(),
        ui.query_variable(
            "namespace", f"label_values({job}, namespace)", label="Namespace", include_all=True
        ),
        ui.query_variable(
            JOB_LABEL,
            f'label_values({job[:-1]}, namespace=~"$namespace"}}, training_job)',
            label="Training job",
        ),
        ui.query_variable(
            "node",
            f"label_values({job[:-1]}, {in_job}}}, node)",
            label="Node",
            multi=True,
            include_all=True,
            all_means_options=node_wide,
        ),
        ui.query_variable(
            "gpu",
            f'label_values({gpus}{{{in_job}, node=~"$node"}}, gpu)',
            label="GPU",
            multi=True,
            include_all=True,
        ),
        ui.query_variable(
            "rank",
            f'label_values(trainprof_training_steps_total{{{in_job}, node=~"$node"}}, rank)',
            label="Rank",
            multi=True,
            include_all=True,
        ),
    ]


def dashboard(config: RulesConfig, compiled: Compiled | None = None) -> ui.Dashboard:
    """The job dashboard; `compiled` is `config` compiled, if the caller has it already."""
    compiled = compiled or compile_rules(config)
    scope = Scope(config, JOB_VARIABLES)
    rows = [
        summary_row(scope, compiled),
        system_row(scope, compiled),
        framework_row(scope, compiled),
        rules_summary_row(scope, compiled),
        profiler_views_row(scope, compiled),
        kernels_row(scope),
    ]
    rows += [rule_row(scope, compiled, i) for i in compiled.alerting]
    return ui.dashboard(
        TITLE,
        UID,
        f"Code generated by make generate. DO NOT EDIT. Edit {SOURCE}.\n"
        "One training job as SageMaker Debugger's profiling report: job summary, system "
        "usage, framework metrics, the profiler rules and what each one watches.",
        rows,
        variables(config),
        tags=["trainprof"],
        links=[
            ui.link_to(
                "Fleet overview",
                FLEET_DASHBOARD.uid,
                FLEET_DASHBOARD.slug,
                "Every running job, rules firing, idle GPU-hours",
            ),
            ui.link_with(
                "Compare with another run",
                COMPARE_DASHBOARD.url()
                + "?var-job_a=$training_job&var-job_b=$training_job&var-namespace=$namespace",
                "This job overlaid on another job or an earlier run of its own",
            ),
        ],
    )

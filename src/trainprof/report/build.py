"""From collected numbers to the report's content: facts, tables and charts per section.

The sections are SageMaker's: Training job summary, System usage statistics, Framework
metrics summary, Rules summary, then a detail for each rule that fired.
"""

from __future__ import annotations

import dataclasses
import math
import re

from trainprof import __version__
from trainprof.contract.names import JOB_LABEL, VERSION_LABEL
from trainprof.dashboards.alerts import FIRING, PENDING
from trainprof.dashboards.exprs import SYSTEM_USAGE_NAMES
from trainprof.dashboards.queries import JOB_VARIABLES, Scope
from trainprof.report import format as fmt
from trainprof.report import svg, usage
from trainprof.report.collect import Collected, Points, Series
from trainprof.report.queries import signals
from trainprof.rules.config import RuleInstance, alerting
from trainprof.rules.model import Signal
from trainprof.rules.status import measured_text

MAX_LINES = 12  # series per chart; more would be unreadable
MAX_ALERT_ROWS = 25
MEMORY_NEARLY_FULL = 0.9  # SageMaker advised more memory when the footprint neared the maximum


@dataclasses.dataclass
class Chart:
    title: str
    svg: str
    legend: list[tuple[str, str]]  # (name, colour)
    note: str = ""
    wide: bool = False  # across the page, not in a column of two


@dataclasses.dataclass
class Table:
    columns: list[str]
    rows: list[list[str]]
    numeric: tuple[int, ...] = ()  # right-aligned columns
    caption: str = ""


@dataclasses.dataclass
class Section:
    id: str
    title: str
    intro: str = ""
    facts: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    tables: list[Table] = dataclasses.field(default_factory=list)
    charts: list[Chart] = dataclasses.field(default_factory=list)
    empty: str = ""  # said instead when there is nothing to show


@dataclasses.dataclass
class RuleRow:
    name: str
    severity: str
    description: str
    recommendation: str
    parameters: str
    times_triggered: int
    first_fired_at: float | None
    state: str  # firing | pending at the end, else the status: quiet | no_data | not_applicable
    status: str = "quiet"  # fired | quiet | no_data | not_applicable over the whole range
    datapoints: str = "-"
    measured: str = "-"  # "46% (peak 74%) vs above 50%"
    reason: str = ""  # why no_data / not_applicable
    first_fired_step: int | None = None  # the training step, for a tensor trial's rules


@dataclasses.dataclass
class RuleDetail:
    row: RuleRow
    summary: str
    charts: list[Chart]
    alerts: Table
    # The units (GPUs, nodes, ranks, ...) its alerts found: one row each.
    units: Table | None = None


@dataclasses.dataclass
class Report:
    training_job: str
    source: str
    start: float
    end: float
    generator: str
    sections: list[Section]
    rules: list[RuleRow]
    timeline: Chart | None
    details: list[RuleDetail]
    notes: list[str]


def legend_text(template: str, labels: dict[str, str]) -> str:
    """A Grafana legend format filled in: "{{node}} GPU {{gpu}}" -> "n1 GPU 0"."""
    if not template:
        shown = {k: v for k, v in labels.items() if k != "__name__"}
        return ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)


class _Numbers:
    def __init__(self, c: Collected):
        self.c = c

    def series(self, name: str) -> Series:
        return self.c.results.get(name, [])

    def scalar(self, name: str) -> float | None:
        values = [points[-1][1] for _, points in self.series(name) if points]
        finite = [v for v in values if not math.isnan(v)]
        return finite[0] if finite else None

    def _legend(self, name: str) -> str:
        query = self.c.queries.get(name)
        return query.legend if query else ""

    def by_legend(self, name: str) -> list[tuple[str, float]]:
        legend = self._legend(name)
        return sorted(
            (legend_text(legend, labels), points[-1][1])
            for labels, points in self.series(name)
            if points
        )

    def lines(self, name: str) -> list[tuple[str, Points]]:
        legend = self._legend(name)
        return sorted(
            (legend_text(legend, labels), points) for labels, points in self.series(name) if points
        )


def _chart(
    c: Collected,
    title: str,
    lines: list[tuple[str, Points]],
    unit: str,
    signal: Signal | None = None,
    firing=(),
) -> Chart | None:
    if not lines:
        return None
    note = ""
    if len(lines) > MAX_LINES:
        note = (
            f"{MAX_LINES} of {len(lines)} series shown: those with the highest mean "
            "(the lowest, for a rule that fires below its threshold)."
        )
        below = signal is not None and signal.threshold.fires == "below"
        lines = sorted(
            lines, key=lambda item: sum(v for _, v in item[1]) / len(item[1]), reverse=not below
        )[:MAX_LINES]
        lines.sort()
    threshold = signal.threshold if signal else None
    drawn = svg.line_chart(
        lines,
        unit=unit,
        start=c.start,
        end=c.end,
        threshold=threshold.value if threshold else None,
        fires=threshold.fires if threshold else "above",
        threshold_text=threshold.text if threshold else "",
        firing=firing,
        label=title,
    )
    return Chart(title, drawn, [(name, svg.color(i)) for i, (name, _) in enumerate(lines)], note)


def _spans(points: Points, step: float) -> list[tuple[float, float]]:
    """Time spans covered by `points` (taken `step` apart) with a value above 0."""
    spans: list[list[float]] = []
    for t, v in sorted(points):
        if v <= 0:
            continue
        if spans and t - spans[-1][1] <= step * 1.5:
            spans[-1][1] = t
        else:
            spans.append([t, t])
    return [(a - step, b) for a, b in spans]


# --- sections --------------------------------------------------------------------------------


def _summary(c: Collected, n: _Numbers, rules: list[RuleRow]) -> Section:
    start_ms = n.scalar("summary.start")
    elapsed = n.scalar("summary.elapsed")
    init = n.scalar("summary.initialization")
    steps = n.by_legend("summary.steps")
    rate = n.scalar("summary.step_rate")
    fired = [r for r in rules if r.times_triggered]
    facts = [
        ("Training job", c.training_job),
        ("Source", c.source),
        (
            "Start",
            fmt.when(start_ms / 1000)
            if start_ms is not None
            else f"{fmt.when(c.start)} (first sample)",
        ),
        ("End", f"{fmt.when(c.end)} (last data)"),
        ("Duration", fmt.duration(elapsed if elapsed is not None else c.end - c.start)),
        ("Time to first step", fmt.duration(init) if init is not None else "-"),
        (
            "Steps",
            ", ".join(f"{mode or 'all'}: {fmt.number(v)}" for mode, v in steps) if steps else "-",
        ),
        ("Mean step rate", fmt.value(rate, "suffix: steps/s") if rate else "-"),
        ("Nodes", _count(n.scalar("summary.nodes"))),
        ("GPUs", _count(n.scalar("summary.gpus"))),
        ("Ranks", _count(n.scalar("summary.ranks"))),
        (
            "Sampling",
            f"every {fmt.duration(c.config.datapoint_interval)}, scraped every "
            f"{fmt.duration(c.config.scrape_interval)}",
        ),
        ("Rules fired", f"{len(fired)} of {len(rules)}"),
    ]
    facts += _phases(c, n)
    advice = sizing_advice(rules, n)
    if advice:
        facts.append(("Sizing advice", " ".join(advice)))
    facts = [(k, v) for k, v in facts if v != "-"]
    intro = (
        f"{c.training_job} ran for "
        f"{fmt.duration(elapsed if elapsed is not None else c.end - c.start)}"
    )
    nodes, gpus = n.scalar("summary.nodes"), n.scalar("summary.gpus")
    if nodes:
        intro += f" on {_count(nodes)} node{'s' if nodes != 1 else ''}"
        if gpus:
            intro += f" with {_count(gpus)} GPU{'s' if gpus != 1 else ''}"
    intro += ". "
    if fired:
        top = max(fired, key=lambda r: r.times_triggered)
        intro += (
            f"{len(fired)} of {len(rules)} rules fired; {top.name} triggered most "
            f"often ({top.times_triggered} time{'s' if top.times_triggered != 1 else ''})"
            "."
        )
    else:
        intro += f"None of the {len(rules)} rules fired."
    section = Section("training-job-summary", "Training job summary", intro, facts)
    chart = _chart(
        c, "Step rate per rank", n.lines("summary.step_rate_per_rank"), "suffix: steps/s"
    )
    if chart:
        section.charts.append(chart)
    return section


def sizing_advice(rules: list[RuleRow], n: _Numbers) -> list[str]:
    """SageMaker's instance sizing advice, where its rules gave it: from the rules that
    fired, and from memory close to full (OverallSystemUsage's advice)."""
    fired = {r.name for r in rules if r.times_triggered}
    advice = []
    underused = sorted(fired & {"BatchSize", "LowGPUUtilization"})
    if underused:
        advice.append(
            f"The GPUs were underused ({' and '.join(underused)} fired): consider a smaller "
            "instance type, or a larger batch size."
        )
    if "CPUBottleneck" in fired:
        advice.append(
            "The CPU held the GPUs back (CPUBottleneck fired): after the data-loading fixes, "
            "consider an instance type with more CPU cores per GPU."
        )
    highest: dict[str, float] = {}
    for (_, _, resource), found in usage.summaries(n.series("usage.node_buckets")).items():
        highest[resource] = max(highest.get(resource, 0.0), found["p99"])
    for resource in ("Host memory", "GPU memory"):
        if highest.get(resource, 0.0) >= MEMORY_NEARLY_FULL:
            advice.append(
                f"{resource} reached {fmt.value(highest[resource], 'percentunit')} (p99): "
                "choose an instance type with more memory if the footprint stays this close "
                "to the maximum."
            )
    return advice


def _phases(c: Collected, n: _Numbers) -> list[tuple[str, str]]:
    """SageMaker's job summary split: initialisation (start to the first step), training
    loop (first to last step), finalisation (last step to the end of the data)."""
    start, first, last = (n.scalar(f"phases.{k}") for k in ("start", "first_step", "last_step"))
    if start is None or first is None or last is None or not start <= first <= last:
        return []
    end = max(c.end, last)
    total = end - start
    if total <= 0:
        return []
    parts = (
        ("Initialization", first - start),
        ("Training loop", last - first),
        ("Finalization", end - last),
    )
    return [
        (name, f"{fmt.duration(seconds)} ({fmt.value(seconds / total, 'percentunit')})")
        for name, seconds in parts
    ]


def _count(x: float | None) -> str:
    return "-" if x is None else fmt.number(x)


def _system(c: Collected, n: _Numbers) -> Section:
    section = Section(
        "system-usage-statistics",
        "System usage statistics",
        "Percentiles of every sample since the exporter started "
        "(SageMaker's OverallSystemUsage); GPU percentiles pool the node's "
        "GPUs.",
    )
    rows: dict[tuple[str, str], dict[str, float]] = {}
    order = list(SYSTEM_USAGE_NAMES.values())
    usage_table = _usage_table(n, order)
    if usage_table:
        section.tables.append(usage_table)
    else:
        for q in ("p50", "p95", "p99"):
            for labels, points in n.series(f"system.{q}"):
                key = (labels.get("node", ""), labels.get("resource", ""))
                rows.setdefault(key, {})[q] = points[-1][1]
    totals = _totals_table(n)
    if totals:
        section.tables.append(totals)
    if rows:
        section.tables.append(
            Table(
                ["Node", "Resource", "p50", "p95", "p99"],
                [
                    [node, resource]
                    + [fmt.value(v.get(q), "percentunit") for q in ("p50", "p95", "p99")]
                    for (node, resource), v in sorted(
                        rows.items(),
                        key=lambda kv: (
                            kv[0][0],
                            order.index(kv[0][1]) if kv[0][1] in order else 99,
                        ),
                    )
                ],
                numeric=(2, 3, 4),
                caption="Overall system usage",
            )
        )
    duration = c.end - c.start
    busy = n.by_legend("system.gpu_busy")
    if busy:
        section.tables.append(
            Table(
                ["GPU", "Active time", "Share of the job"],
                [
                    [name, fmt.duration(v), fmt.value(v / duration, "percentunit")]
                    for name, v in busy
                ],
                numeric=(1, 2),
                caption="GPU active time (a kernel running), as in SageMaker's Profiler UI",
            )
        )
    for name, title, unit in (
        ("system.cpu", "CPU utilization (average of the cores)", "percentunit"),
        ("system.gpu", "GPU utilization", "percentunit"),
        ("system.gpu_memory", "GPU memory used", "percentunit"),
        ("system.iowait", "I/O wait (average of the cores)", "percentunit"),
        ("system.memory", "Host memory used", "percentunit"),
    ):
        chart = _chart(c, title, n.lines(name), unit)
        if chart:
            section.charts.append(chart)
    network = n.lines("system.network_receive") + n.lines("system.network_transmit")
    chart = _chart(c, "Network", network, "Bps")
    if chart:
        section.charts.append(chart)
    if not rows and not usage_table and not section.charts:
        section.empty = "No system metrics for this job in the source."
    return section


def _usage_table(n: _Numbers, order: list[str]) -> Table | None:
    """min / p50 / p90 / p95 / p99 / max per node and resource, then per GPU."""
    columns = ("min",) + usage.QUANTILES + ("max",)
    rows = []
    for query, per_gpu in (("usage.node_buckets", False), ("usage.gpu_buckets", True)):
        grouped = usage.summaries(n.series(query))
        for (node, gpu, resource), found in sorted(
            grouped.items(),
            key=lambda kv: (
                kv[0][0],
                order.index(kv[0][2]) if kv[0][2] in order else 99,
                int(kv[0][1]) if kv[0][1].isdigit() else kv[0][1],
            ),
        ):
            label = f"GPU {gpu} {resource.removeprefix('GPU ')}" if per_gpu else resource
            rows.append([node, label] + [fmt.value(found[c], "percentunit") for c in columns])
    if not rows:
        return None
    return Table(
        ["Node", "Resource", "min", "p50", "p90", "p95", "p99", "max"],
        rows,
        numeric=tuple(range(2, 8)),
        caption="Overall system usage: every sample since the exporter started (GPU rows "
        "per node pool the node's GPUs, then one row per GPU); min and max to the "
        "histogram's bucket",
    )


def _totals_table(n: _Numbers) -> Table | None:
    totals: dict[str, dict[str, float]] = {}
    for labels, points in n.series("usage.totals"):
        if points and not math.isnan(points[-1][1]):
            totals.setdefault(labels.get("node", ""), {})[labels.get("total", "")] = points[-1][1]
    if not totals:
        return None
    names = list(usage.TOTALS.values())
    rows = [
        [node] + [fmt.value(values[k], "bytes") if k in values else "-" for k in names]
        for node, values in sorted(totals.items())
    ]
    if len(rows) > 1:
        rows.append(
            ["all nodes"]
            + [fmt.value(sum(v.get(k, 0.0) for v in totals.values()), "bytes") for k in names]
        )
    return Table(["Node"] + names, rows, numeric=(1, 2, 3, 4), caption="Disk and network totals")


def _framework(c: Collected, n: _Numbers) -> Section:
    section = Section(
        "framework-metrics-summary",
        "Framework metrics summary",
        "Step durations and where the training loop spends its time "
        "(SageMaker's OverallFrameworkMetrics), from the training API's "
        "metrics.",
    )
    buckets = sorted(
        (
            (float(labels["le"]), points[-1][1])
            for labels, points in n.series("framework.step_buckets")
            if points and "le" in labels
        ),
        key=lambda b: b[0],
    )
    counts = [(le, v - (buckets[i - 1][1] if i else 0)) for i, (le, v) in enumerate(buckets)]
    if counts and sum(v for _, v in counts) > 0:
        while counts and counts[-1][1] <= 0:
            counts.pop()
        first = next(i for i, (_, v) in enumerate(counts) if v > 0)
        bars = [
            (
                ("> " + fmt.axis(counts[i - 1][0], "s"))
                if math.isinf(le)
                else ("≤ " + fmt.axis(le, "s")),
                v,
            )
            for i, (le, v) in enumerate(counts)
        ]
        bars = bars[max(first - 1, 0) :]
        section.charts.append(
            Chart(
                "Step duration histogram",
                svg.bar_chart(bars, unit="none", label="Step duration histogram"),
                [],
            )
        )
    lines = []
    for q in ("p50", "p90", "p99"):
        lines += [(f"{q} {name}", points) for name, points in n.lines(f"framework.step_{q}")]
    chart = _chart(c, "Step duration percentiles", lines, "s")
    if chart:
        section.charts.append(chart)
    phases = n.by_legend("framework.phases")
    if phases:
        phases.sort(key=lambda p: -p[1])
        total = dict(n.by_legend("framework.phase_seconds"))
        per_step = dict(n.by_legend("framework.phase_per_step"))
        section.charts.append(
            Chart(
                "Phase breakdown (since start)",
                svg.share_bar(phases, "Phase breakdown"),
                [(name, svg.color(i)) for i, (name, _) in enumerate(phases)],
                wide=True,
            )
        )
        section.tables.append(
            Table(
                ["Phase", "Share of the loop", "Time in the range", "Per step"],
                [
                    [
                        name,
                        fmt.value(share, "percentunit"),
                        fmt.duration(total.get(name, math.nan)),
                        fmt.duration(per_step.get(name, math.nan)),
                    ]
                    for name, share in phases
                ],
                numeric=(1, 2, 3),
                caption="Per-annotation durations",
            )
        )
    modes = n.by_legend("framework.modes")
    if len(modes) > 1:
        section.facts.append(
            (
                "Step time per mode",
                ", ".join(f"{m}: {fmt.value(v, 'percentunit')}" for m, v in modes),
            )
        )
    chart = _chart(c, "Dataloader share per rank", n.lines("framework.dataloader"), "percentunit")
    if chart:
        section.charts.append(chart)
    if not section.charts and not section.tables:
        section.empty = (
            "No training-step metrics for this job: the source holds no data "
            "from trainprof's training API (SageMaker's system metrics carry "
            "none either)."
        )
    return section


def _parameters(instance: RuleInstance) -> str:
    return ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
        for k, v in instance.values.items()
        if v is not None
    )


def _rules(c: Collected, n: _Numbers) -> tuple[list[RuleRow], dict[str, list]]:
    states = {legend: v for legend, v in n.by_legend("rules.state")}
    firing = {labels.get("rule", ""): points for labels, points in n.series("rules.firing")}
    rows, spans = [], {}
    for instance in alerting(c.config):
        name = instance.spec.name
        verdict = c.verdicts.get(name)
        alerts = verdict.alerts if verdict else []
        state = states.get(name, 0)
        status = verdict.status if verdict and verdict.status else None
        quiet = status.status if status and status.status != "fired" else "quiet"
        if status and status.status == "fired" and not states:
            quiet = "fired"  # no state series (a tensor trial): fired, end state unknown
        rows.append(
            RuleRow(
                name,
                instance.severity,
                instance.spec.detects,
                instance.spec.recommendation,
                _parameters(instance),
                len(alerts),
                min((a.fired_at for a in alerts), default=None),
                "firing" if state >= FIRING else "pending" if state >= PENDING else quiet,
                status.status if status else ("fired" if alerts else "quiet"),
                fmt.number(status.datapoints) if status and status.datapoints is not None else "-",
                measured_text(status.measure) if status else "-",
                status.reason if status else "",
                verdict.first_fired_step if verdict else None,
            )
        )
        spans[name] = _spans(firing.get(name, []), c.step)
    return rows, spans


def _rules_section(rows: list[RuleRow]) -> Section:
    fired = sorted((r for r in rows if r.times_triggered), key=lambda r: -r.times_triggered)
    intro = (
        "The profiler rules, sorted by how often each triggered (an alert that started "
        "firing: one per job and reason, the GPUs, nodes or ranks it found listed with it)."
    )
    if fired:
        top = fired[0]
        intro += (
            f" {top.name} triggered most often: {top.times_triggered} "
            f"time{'s' if top.times_triggered != 1 else ''}, first at "
            f"{fmt.when(top.first_fired_at)}."
        )
    return Section("rules-summary", "Rules summary", intro)


def _details(c: Collected, rows: list[RuleRow], spans: dict[str, list]) -> list[RuleDetail]:
    scope = Scope(c.config, JOB_VARIABLES)
    compiled = c.compiled
    n = _Numbers(c)
    details = []
    by_name = {i.spec.name: i for i in compiled.alerting}
    for row in sorted((r for r in rows if r.times_triggered), key=lambda r: -r.times_triggered):
        instance = by_name[row.name]
        charts = []
        for i, signal in enumerate(signals(compiled, instance, scope)):
            chart = _chart(
                c,
                signal.title,
                n.lines(f"rule.{row.name}.{i}"),
                signal.unit,
                signal,
                spans.get(row.name, []),
            )
            if chart:
                charts.append(chart)
        alerts = c.verdicts[row.name].alerts
        shown = alerts[:MAX_ALERT_ROWS]
        keys = sorted(
            {k for a in shown for k in a.labels}
            - {
                "alertname",
                "rule",
                "severity",
                VERSION_LABEL,
                JOB_LABEL,
                "namespace",
                "job",
                "instance",
                "uuid",
                "peer_uuid",
            }
        )
        table = Table(
            ["Fired at"] + keys,
            [[fmt.when(a.fired_at)] + [a.labels.get(k, "") for k in keys] for a in shown],
            caption=f"Alerts ({len(alerts)})"
            + (f", the first {MAX_ALERT_ROWS} shown" if len(alerts) > len(shown) else ""),
        )
        units = _units_table(c, row.name)
        details.append(RuleDetail(row, instance.spec.summary, charts, table, units))
    return details


MAX_UNIT_ROWS = 50


def _units_table(c: Collected, name: str) -> Table | None:
    """What the rule's alerts found, one row per GPU, node, rank...: first and last found,
    the worst value (as its alert's description shows it)."""
    found = c.verdicts[name].affected
    if not found:
        return None
    shown = found[:MAX_UNIT_ROWS]
    percent = {
        tuple(sorted(a.labels.items()))
        for a in c.compiled.affected_of(name)
        if a.units is not None and "humanizePercentage" in a.units.value
    }
    keys = sorted({k for u in shown for k in u.labels} - {"job", "instance", "uuid", "peer_uuid"})

    def worst(u) -> str:
        own = tuple(sorted((k, v) for k, v in u.labels.items() if k in ("reason",)))
        return fmt.value(u.worst, "percentunit" if own in percent else "none")

    return Table(
        [*keys, "First found", "Last found", "Worst"],
        [
            [u.labels.get(k, "") for k in keys]
            + [fmt.when(u.first_at), fmt.when(u.last_at), worst(u)]
            for u in shown
        ],
        caption=f"Found ({len(found)})"
        + (f", the first {MAX_UNIT_ROWS} shown" if len(found) > len(shown) else ""),
    )


def build(c: Collected) -> Report:
    n = _Numbers(c)
    rows, spans = _rules(c, n)
    timeline = None
    if any(spans.values()):
        drawn = svg.timeline(
            [(r.name, spans[r.name]) for r in rows],
            start=c.start,
            end=c.end,
            label="When each rule fired",
        )
        timeline = Chart("When each rule fired", drawn, [], wide=True)
    sections = [_summary(c, n, rows), _system(c, n), _framework(c, n), _rules_section(rows)]
    rows.sort(key=lambda r: -r.times_triggered)
    return Report(
        c.training_job,
        c.source,
        c.start,
        c.end,
        f"trainprof {__version__}",
        sections,
        rows,
        timeline,
        _details(c, rows, spans),
        list(c.notes),
    )

"""The report as one self-contained HTML file: inline CSS, inline SVG, no script.

A Content-Security-Policy forbids every fetch, so the file shows the same offline, years
later, as on the day it was written. Every text from the data (job names, label values) is
escaped: a label value of `<script>` is shown, never run.
"""

from __future__ import annotations

import re
from html import escape

from trainprof.report import format as fmt
from trainprof.report.build import Chart, Report, RuleDetail, Section, Table

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"

STYLE = """
:root { --ink: #1d2330; --muted: #5d6675; --line: #d9dde3; --band: #f4f6f9;
        --accent: #2d5a96; --red: #b42e2e; --amber: #b7791f; --green: #2f7d4b; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--ink); background: #fff;
       font: 14px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
header { background: #1f2f4a; color: #fff; padding: 22px 0 18px; }
header .wrap, main, footer { max-width: 1060px; margin: 0 auto; padding: 0 24px; }
header h1 { margin: 0; font-size: 13px; font-weight: 600; letter-spacing: .08em;
            text-transform: uppercase; color: #b9c7dd; }
header .job { margin: 4px 0 6px; font-size: 26px; font-weight: 650; word-break: break-all; }
header .meta { margin: 0; color: #c9d3e3; font-size: 13px; }
nav { border-bottom: 1px solid var(--line); background: var(--band); }
nav ul { max-width: 1060px; margin: 0 auto; padding: 8px 24px; list-style: none;
         display: flex; flex-wrap: wrap; gap: 4px 22px; font-size: 13px; }
nav a { color: var(--accent); text-decoration: none; }
section { padding: 10px 0 8px; border-bottom: 1px solid var(--line); }
h2 { font-size: 20px; margin: 22px 0 6px; }
h3 { font-size: 16px; margin: 18px 0 4px; }
h4 { font-size: 14px; margin: 14px 0 2px; color: var(--muted); font-weight: 600; }
p.intro { margin: 0 0 12px; max-width: 860px; }
.facts { display: grid; grid-template-columns: repeat(auto-fill, minmax(200px, 1fr));
         gap: 8px; margin: 10px 0 14px; }
.fact { background: var(--band); border: 1px solid var(--line); border-radius: 6px;
        padding: 7px 10px; }
.fact .k { font-size: 12px; color: var(--muted); }
.fact .v { font-weight: 600; word-break: break-word; }
table { border-collapse: collapse; width: 100%; margin: 6px 0 14px; font-size: 13px; }
caption { text-align: left; font-weight: 600; padding: 4px 0; color: var(--muted); }
th, td { border-bottom: 1px solid var(--line); padding: 5px 8px; text-align: left;
         vertical-align: top; overflow-wrap: anywhere; }
th { background: var(--band); font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.num { white-space: nowrap; }
tr.fired td:first-child { border-left: 3px solid var(--red); }
table.rules { table-layout: fixed; }
table.rules col.rule { width: 15%; } table.rules col.description { width: 31%; }
table.rules col.recommendation { width: 27%; } table.rules col.count { width: 9%; }
table.rules col.when { width: 9%; } table.rules col.state { width: 9%; }
table.rules tr.params td { border-top: 0; padding-top: 0; font-size: 12px;
                           color: var(--muted); }
table.rules tr.main td { border-bottom: 0; }
code { font: 12px/1.3 ui-monospace, "DejaVu Sans Mono", monospace; background: #eef1f5;
       padding: 0 3px; border-radius: 3px; }
.figure { margin: 6px 0 14px; min-width: 0; }
.charts { display: grid; grid-template-columns: 1fr 1fr; gap: 0 22px; }
@media (max-width: 760px) { .charts { grid-template-columns: 1fr; } }
.charts .wide { grid-column: 1 / -1; }
.figure h4 { margin-bottom: 2px; }
svg.chart { width: 100%; height: auto; display: block; }
svg .grid { stroke: #e6e9ee; stroke-width: 1; }
svg .frame { fill: none; stroke: #c5cbd3; }
svg .tick { font-size: 10.5px; fill: var(--muted); }
svg .lane { font-size: 11.5px; fill: var(--ink); }
svg .lane-bg { fill: #eef1f5; }
svg .threshold { font-size: 11px; fill: var(--red); font-weight: 600; }
svg .inbar { font-size: 11px; fill: #fff; font-weight: 600; }
ul.legend { list-style: none; margin: 2px 0 0; padding: 0; display: flex; flex-wrap: wrap;
            gap: 2px 16px; font-size: 12px; color: var(--muted); }
ul.legend li { min-width: 0; max-width: 100%; overflow-wrap: anywhere; }
ul.legend i { display: inline-block; width: 11px; height: 11px; border-radius: 2px;
              margin-right: 5px; vertical-align: -1px; }
.note { font-size: 12px; color: var(--muted); }
.empty { padding: 10px 12px; background: var(--band); border-radius: 6px; color: var(--muted); }
.badge { display: inline-block; padding: 0 7px; border-radius: 9px; font-size: 11.5px;
         font-weight: 600; color: #fff; vertical-align: 2px; }
.badge.critical, .badge.firing { background: var(--red); }
.badge.warning, .badge.pending { background: var(--amber); }
.badge.info { background: var(--accent); }
.badge.ok, .badge.quiet { background: var(--green); }
.badge.no_data, .badge.not_applicable { background: var(--muted); }
article.rule { border: 1px solid var(--line); border-radius: 8px; padding: 4px 16px 6px;
               margin: 14px 0; }
article.rule .rec { background: #fbf6ea; border-left: 3px solid var(--amber);
                    padding: 6px 10px; margin: 8px 0; }
footer { padding: 16px 24px 30px; color: var(--muted); font-size: 12px; }
@media print { nav { display: none; } article.rule, .figure { break-inside: avoid; } }
"""


def esc(text: object) -> str:
    return escape(fmt.visible(str(text)), quote=True)


def prose(text: str) -> str:
    """Catalog prose: escaped, with its `backticked` parameter names as code."""
    return re.sub(r"`([^`<>]+)`", r"<code>\1</code>", esc(text))


def _facts(facts) -> str:
    if not facts:
        return ""
    cells = "".join(
        f'<div class="fact"><div class="k">{esc(k)}</div><div class="v">{esc(v)}</div></div>'
        for k, v in facts
    )
    return f'<div class="facts">{cells}</div>'


def _table(t: Table, css: str = "", fired_rows: set[int] | None = None) -> str:
    head = "".join(
        f'<th class="num">{esc(c)}</th>' if i in t.numeric else f"<th>{esc(c)}</th>"
        for i, c in enumerate(t.columns)
    )
    body = []
    for r, row in enumerate(t.rows):
        cls = ' class="fired"' if fired_rows and r in fired_rows else ""
        cells = "".join(
            f'<td class="num">{esc(v)}</td>' if i in t.numeric else f"<td>{esc(v)}</td>"
            for i, v in enumerate(row)
        )
        body.append(f"<tr{cls}>{cells}</tr>")
    caption = f"<caption>{esc(t.caption)}</caption>" if t.caption else ""
    css_attr = f' class="{css}"' if css else ""
    return (
        f"<table{css_attr}>{caption}<thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _chart(c: Chart) -> str:
    legend = ""
    if c.legend:
        items = "".join(
            f'<li><i style="background:{esc(color)}"></i>{esc(name)}</li>'
            for name, color in c.legend
        )
        legend = f'<ul class="legend">{items}</ul>'
    note = f'<p class="note">{esc(c.note)}</p>' if c.note else ""
    css = "figure wide" if c.wide else "figure"
    return f'<div class="{css}"><h4>{esc(c.title)}</h4>{c.svg}{legend}{note}</div>'


def _section(s: Section, extra: str = "") -> str:
    parts = [f'<section id="{esc(s.id)}"><h2>{esc(s.title)}</h2>']
    if s.intro:
        parts.append(f'<p class="intro">{esc(s.intro)}</p>')
    parts.append(_facts(s.facts))
    parts += [_table(t) for t in s.tables]
    if s.charts:
        parts.append(f'<div class="charts">{"".join(_chart(c) for c in s.charts)}</div>')
    if s.empty:
        parts.append(f'<p class="empty">{esc(s.empty)}</p>')
    parts.append(extra)
    parts.append("</section>")
    return "".join(parts)


def _badge(kind: str) -> str:
    return f'<span class="badge {esc(kind)}">{esc(kind)}</span>'


def _reason(r) -> str:
    return f'<br><span class="note">{esc(r.reason)}</span>' if r.reason else ""


def _rules_table(report: Report) -> str:
    cols = "".join(
        f'<col class="{c}">'
        for c in ("rule", "description", "recommendation", "count", "when", "state")
    )
    head = (
        "<tr><th>Rule</th><th>Description</th><th>Recommendation</th>"
        '<th class="num">Times triggered</th><th>First fired</th><th>Status</th></tr>'
    )
    body = []
    for r in report.rules:
        fired = " fired" if r.times_triggered else ""
        name = (
            f'<a href="#rule-{esc(r.name)}">{esc(r.name)}</a>' if r.times_triggered else esc(r.name)
        )
        first = fmt.short_when(r.first_fired_at, report.start, report.end)
        if r.first_fired_step is not None:
            first = f"step {r.first_fired_step} ({first})"
        body.append(
            f'<tr class="main{fired}" data-rule="{esc(r.name)}"><td>{name}<br>'
            f"{_badge(r.severity)}</td><td>{prose(r.description)}</td>"
            f"<td>{prose(r.recommendation)}</td>"
            f'<td class="num">{r.times_triggered}</td><td>{esc(first)}</td>'
            f"<td>{_badge(r.state)}{_reason(r)}</td></tr>"
            f'<tr class="params{fired}"><td></td><td colspan="5">'
            f"Datapoints analysed: {esc(r.datapoints)}; measured: {esc(r.measured)}. "
            f"Parameters: {esc(r.parameters)}</td></tr>"
        )
    return (
        f'<table class="rules"><colgroup>{cols}</colgroup><thead>{head}</thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _detail(d: RuleDetail) -> str:
    r = d.row
    parts = [
        f'<article class="rule" id="rule-{esc(r.name)}">',
        f"<h3>{esc(r.name)}: {esc(d.summary)} {_badge(r.severity)}</h3>",
        f"<p>Triggered {r.times_triggered} time{'s' if r.times_triggered != 1 else ''}, "
        f"first at {esc(fmt.when(r.first_fired_at))}"
        + ("" if r.first_fired_step is None else f" (training step {r.first_fired_step})")
        + f"; {esc(r.state)} at the end of the "
        "report.</p>",
        f"<p>{prose(r.description)}</p>",
        f'<p class="rec"><strong>Recommendation.</strong> {prose(r.recommendation)}</p>',
        f'<p class="note">Parameters: {esc(r.parameters)}. Dashed line: the threshold; '
        "shaded: when the rule fired.</p>",
    ]
    if d.charts:
        parts.append(f'<div class="charts">{"".join(_chart(c) for c in d.charts)}</div>')
    if d.alerts.rows:
        parts.append(_table(d.alerts))
    if d.units is not None and d.units.rows:
        parts.append(_table(d.units))
    parts.append("</article>")
    return "".join(parts)


def head(title: str, style: str) -> str:
    """A page's start up to its body: `title` is markup (escaped already), `style` the CSS.

    >>> head("A &amp; B", "p{}")[-64:]
    'scale=1"><title>A &amp; B</title><style>p{}</style></head><body>'
    """
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{title}</title><style>{style}</style></head><body>"
    )


def render(report: Report) -> str:
    sections = report.sections
    rules_extra = (_chart(report.timeline) if report.timeline else "") + _rules_table(report)
    body = [_section(s, rules_extra if s.id == "rules-summary" else "") for s in sections]
    if report.details:
        body.append(
            '<section id="rule-details"><h2>Rules that fired</h2>'
            + "".join(_detail(d) for d in report.details)
            + "</section>"
        )
    nav_items = [(s.id, s.title) for s in sections]
    if report.details:
        nav_items.append(("rule-details", "Rules that fired"))
    nav = "".join(f'<li><a href="#{esc(i)}">{esc(t)}</a></li>' for i, t in nav_items)
    notes = "".join(f"<li>{esc(n)}</li>" for n in report.notes)
    notes_html = f"<p>Notes:</p><ul>{notes}</ul>" if notes else ""
    return (
        head(f"Profiling report: {esc(report.training_job)}", STYLE)
        + '<header><div class="wrap"><h1>Training profiling report</h1>'
        f'<p class="job">{esc(report.training_job)}</p>'
        f'<p class="meta">{esc(fmt.when(report.start))} to {esc(fmt.when(report.end))} · '
        f"{esc(report.source)}</p></div></header>"
        f"<nav><ul>{nav}</ul></nav><main>{''.join(body)}</main>"
        f"<footer><p>Generated by {esc(report.generator)} from the SageMaker Debugger profiler "
        "rules it implements; times are UTC. Recommendations are starting points, not "
        f"verdicts.</p>{notes_html}</footer></body></html>\n"
    )


# The compare report (trainprof.compare.page) is written in this style, with these pieces.
badge_html, section_html = _badge, _section

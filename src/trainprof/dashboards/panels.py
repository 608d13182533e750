"""House style for trainprof's Grafana dashboards, and the only module that imports grafanalib.

As grafanalib's own `weave.py` does for Weaveworks, this module holds the policy (panel sizes,
units, colours, the datasource variable, layout) so a dashboard module only says what to show:

    rows = [row("System usage statistics", [
        timeseries("CPU utilization", [target(expr, "{{node}}")], unit=RATIO),
    ])]
    json_text = render(dashboard("Trainprof job", "trainprof-job", "...", rows, variables))

grafanalib 0.7.1 writes Grafana's schema version 12: legacy root keys (`rows`, `style`,
`sharedCrosshair`, `__inputs`, ...), datasources as bare strings, a `null` for every unset
attribute, and pre-Grafana-8 heatmap and bar gauge panels. `modernize` turns that into the
current dashboard model (checked against the JSON schema of @grafana/schema 13.2.3 in the
tests); heatmaps and bar gauges are written in their current shape by `_CurrentPanel`.
Replacing grafanalib (with grafana-foundation-sdk, say) means rewriting this module only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import attr
from grafanalib import core
from grafanalib._gen import DashboardEncoder

from trainprof.dashboards.alerts import FIRING, OK, PENDING
from trainprof.generation.render import to_json

# What the dashboard modules build and pass around, named here so that they need not import
# grafanalib themselves.
Dashboard = core.Dashboard
Panel = core.Panel
Row = core.RowPanel
Table = core.Table
Stat = core.Stat
TimeSeries = core.TimeSeries
Variable = core.Template

# The first schema version whose panel model this module writes (Grafana 10.4 and later
# load it without migrating anything we rely on).
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24

# Grafana unit ids.
RATIO = "percentunit"
SECONDS = "s"
DURATION = "dtdurations"
BYTES_PER_SECOND = "Bps"
TIMESTAMP_MS = "dateTimeAsIso"
COUNT = "none"
STEPS_PER_SECOND = "suffix: steps/s"

# How a rule's state (dashboards.alerts.state_now: 2, 1, 0) is shown.
STATE_MAPPINGS = [
    {
        "type": "value",
        "options": {
            str(OK): {"text": "OK", "color": "green", "index": 0},
            str(PENDING): {"text": "pending", "color": "yellow", "index": 1},
            str(FIRING): {"text": "FIRING", "color": "red", "index": 2},
        },
    }
]


@attr.s
class _CurrentPanel(core.Panel):
    """A panel written in the current Grafana model (`type`, `options`, `fieldConfig`), for
    panel types grafanalib only knows in their pre-Grafana-8 shape (heatmap, bar gauge)."""

    type: str = attr.ib(default="")
    options: dict[str, Any] = attr.ib(factory=dict)
    fieldConfig: dict[str, Any] = attr.ib(factory=dict)

    def to_json_data(self):
        return self.panel_json(
            {"type": self.type, "options": self.options, "fieldConfig": self.fieldConfig}
        )


# --- queries and thresholds ------------------------------------------------------------------


def target(
    expr: str, legend: str = "", *, instant: bool = False, fmt: str = "time_series", ref: str = ""
) -> core.Target:
    """One Prometheus query of a panel. `fmt` is time_series, table or heatmap."""
    return core.Target(
        expr=expr,
        legendFormat=legend,
        instant=instant,
        format=fmt,
        refId=ref,
        datasource=DATASOURCE,
    )


def threshold_steps(value: float | None = None, fires: str = "above") -> list[dict[str, Any]]:
    """Threshold steps drawing `value` as the line where a rule starts firing: the side on
    which it fires is red, the other side transparent."""
    if value is None:
        return [{"color": "green", "value": None}]
    quiet, firing = "transparent", "red"
    if fires == "below":
        return [{"color": firing, "value": None}, {"color": quiet, "value": value}]
    return [{"color": quiet, "value": None}, {"color": firing, "value": value}]


# --- panels ----------------------------------------------------------------------------------


def _grid(w: int, h: int) -> core.GridPos:
    if not 0 < w <= GRID_WIDTH:
        raise ValueError(f"panel width {w} is not between 1 and {GRID_WIDTH}")
    return core.GridPos(h=h, w=w, x=0, y=0)


def _links(links: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
    return [
        {
            "title": title,
            "url": url,
            "type": "link",
            "icon": "doc",
            "tooltip": "",
            "targetBlank": True,
            "includeVars": False,
            "keepTime": False,
            "asDropdown": False,
            "tags": [],
        }
        for title, url in links
    ]


def timeseries(
    title: str,
    targets: Sequence[core.Target],
    *,
    unit: str = COUNT,
    description: str = "",
    threshold: float | None = None,
    fires: str = "above",
    min_value: int | None = None,
    max_value: int | None = None,
    w: int = 12,
    h: int = 8,
    bars: bool = False,
    stacked: bool = False,
    links: Iterable[tuple[str, str]] = (),
    repeat: str | None = None,
) -> core.TimeSeries:
    """A time series; `threshold` draws the rule's threshold as a dashed line, with the
    firing side shaded."""
    return core.TimeSeries(
        title=title,
        description=description,
        targets=list(targets),
        unit=unit,
        gridPos=_grid(w, h),
        valueMin=min_value,
        valueMax=max_value,
        thresholds=threshold_steps(threshold, fires),
        thresholdsStyleMode="dashed+area" if threshold is not None else "off",
        drawStyle="bars" if bars else "line",
        fillOpacity=60 if bars else 10,
        stacking={"mode": "normal", "group": "A"} if stacked else {"mode": "none"},
        showPoints="never",
        lineWidth=1,
        spanNulls=False,
        legendDisplayMode="table" if len(targets) > 1 else "list",
        legendCalcs=["mean", "max", "lastNotNull"],
        tooltipMode="multi",
        tooltipSort="desc",
        links=_links(links),
        repeat=core.Repeat(direction="h", variable=repeat, maxPerRow=4)
        if repeat
        else core.Repeat(),
    )


def stat(
    title: str,
    targets: Sequence[core.Target],
    *,
    unit: str = COUNT,
    description: str = "",
    mappings: list | None = None,
    threshold: float | None = None,
    fires: str = "above",
    w: int = 4,
    h: int = 4,
    calc: str = "lastNotNull",
    graph: bool = False,
    decimals: int | None = None,
    no_value: str = "no data",
) -> core.Stat:
    """A single number (or one per series)."""
    return core.Stat(
        title=title,
        description=description,
        targets=list(targets),
        format=unit,
        gridPos=_grid(w, h),
        mappings=mappings or [],
        reduceCalc=calc,
        graphMode="area" if graph else "none",
        colorMode="value",
        decimals=decimals,
        textMode="value_and_name" if any(t.legendFormat for t in targets) else "value",
        thresholds=threshold_steps(threshold, fires),
        noValue=no_value,
        color={"mode": "thresholds"},
    )


def table(
    title: str,
    targets: Sequence[core.Target],
    *,
    description: str = "",
    transformations: list[dict] | None = None,
    overrides: list[dict] | None = None,
    unit: str = "",
    w: int = 24,
    h: int = 8,
    sort_by: str | None = None,
    descending: bool = True,
) -> core.Table:
    """A table of instant queries, usually joined by `transformations`."""
    sort = [core.TableSortByField(displayName=sort_by, desc=descending)] if sort_by else []
    return core.Table(
        title=title,
        description=description,
        targets=list(targets),
        unit=unit,
        gridPos=_grid(w, h),
        transformations=transformations or [],
        overrides=overrides or [],
        sortBy=sort,
        filterable=False,
    )


def organize(
    rename: dict[str, str], hide: Sequence[str] = ("Time",), order: Sequence[str] = ()
) -> dict[str, Any]:
    """Grafana's organize transformation of a table: the columns `hide` hidden, `order`
    first, `rename` applied."""
    options: dict[str, Any] = {"excludeByName": dict.fromkeys(hide, True)}
    if order:
        options["indexByName"] = {name: i for i, name in enumerate(order)}
    options["renameByName"] = rename
    return {"id": "organize", "options": options}


def merged(
    rename: dict[str, str], hide: Sequence[str] = ("Time",), order: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """A table's queries merged into one row per series, then `organize`d."""
    return [{"id": "merge", "options": {}}, organize(rename, hide, order)]


def piechart(
    title: str,
    targets: Sequence[core.Target],
    *,
    unit: str = RATIO,
    description: str = "",
    w: int = 8,
    h: int = 8,
) -> core.PieChartv2:
    return core.PieChartv2(
        title=title,
        description=description,
        targets=list(targets),
        unit=unit,
        gridPos=_grid(w, h),
        pieType="donut",
        legendDisplayMode="table",
        legendPlacement="right",
        legendValues=["percent"],
        tooltipMode="single",
        reduceOptionsCalcs=["lastNotNull"],
    )


def heatmap(
    title: str,
    query: core.Target,
    *,
    unit: str = SECONDS,
    description: str = "",
    w: int = 12,
    h: int = 8,
) -> _CurrentPanel:
    """A heatmap of a Prometheus histogram's buckets (`query` in heatmap format)."""
    # grafanalib has no type information: mypy sees only _CurrentPanel's own attrs fields,
    # not those (title, targets, ...) it inherits from core.Panel.
    return _CurrentPanel(  # type: ignore[call-arg]
        type="heatmap",
        title=title,
        description=description,
        targets=[query],
        gridPos=_grid(w, h),
        options={
            "calculate": False,
            "cellGap": 1,
            "color": {
                "mode": "scheme",
                "scheme": "Oranges",
                "scale": "exponential",
                "exponent": 0.5,
                "steps": 64,
                "reverse": False,
                "fill": "dark-orange",
            },
            "yAxis": {"unit": unit, "axisPlacement": "left", "reverse": False},
            "rowsFrame": {"layout": "auto"},
            "cellValues": {"unit": "short"},
            "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False},
            "legend": {"show": True},
            "filterValues": {"le": 1e-9},
        },
        fieldConfig={
            "defaults": {"custom": {"scaleDistribution": {"type": "linear"}}},
            "overrides": [],
        },
    )


def bargauge(
    title: str,
    targets: Sequence[core.Target],
    *,
    unit: str = COUNT,
    description: str = "",
    w: int = 12,
    h: int = 8,
    vertical: bool = False,
) -> _CurrentPanel:
    """Bars, one per series (or per bucket of a histogram in heatmap format)."""
    defaults: dict[str, Any] = {
        "unit": unit,
        "min": 0,
        "color": {"mode": "continuous-BlYlRd"},
        "thresholds": {"mode": "absolute", "steps": threshold_steps(None)},
    }
    # grafanalib has no type information: mypy sees only _CurrentPanel's own attrs fields,
    # not those (title, targets, ...) it inherits from core.Panel.
    return _CurrentPanel(  # type: ignore[call-arg]
        type="bargauge",
        title=title,
        description=description,
        targets=list(targets),
        gridPos=_grid(w, h),
        options={
            "displayMode": "gradient",
            "orientation": "vertical" if vertical else "horizontal",
            "showUnfilled": True,
            "valueMode": "color",
            "namePlacement": "auto",
            "sizing": "auto",
            "minVizHeight": 16,
            "minVizWidth": 8,
            "maxVizHeight": 300,
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "legend": {
                "showLegend": False,
                "displayMode": "list",
                "placement": "bottom",
                "calcs": [],
            },
        },
        fieldConfig={"defaults": defaults, "overrides": []},
    )


def row(title: str, panels: Sequence[core.Panel], collapsed: bool = False) -> core.RowPanel:
    """A dashboard row. Collapsed rows hold their panels (their queries run when opened)."""
    return core.RowPanel(
        title=title,
        panels=list(panels),
        collapsed=collapsed,
        gridPos=core.GridPos(h=1, w=GRID_WIDTH, x=0, y=0),
    )


# --- variables -------------------------------------------------------------------------------


def datasource_variable() -> core.Template:
    return core.Template(
        name="datasource", label="Data source", query="prometheus", type="datasource"
    )


def query_variable(
    name: str,
    query: str,
    *,
    label: str,
    multi: bool = False,
    include_all: bool = False,
    all_means_options: bool = False,
) -> core.Template:
    """A variable filled from `label_values(...)`. With include_all, "All" means the regex
    `.*`, which also matches series without the label (a job without namespaces); with
    all_means_options, Grafana's own default instead: every listed value."""
    return core.Template(
        name=name,
        label=label,
        query=query,
        dataSource=DATASOURCE,
        multi=multi,
        includeAll=include_all,
        allValue=".*" if include_all and not all_means_options else None,
        refresh=core.REFRESH_ON_TIME_RANGE_CHANGE,
        sort=1,
    )


def custom_variable(name: str, options: Sequence[tuple[str, str]], *, label: str) -> core.Template:
    """A variable offering fixed (text, value) pairs, the first selected; Grafana reads them
    from its query as `text : value,...`."""
    return core.Template(
        name=name,
        label=label,
        query=",".join(f"{text} : {value}" for text, value in options),
        type="custom",
        default=options[0][1],
        options=[
            {"selected": i == 0, "text": text, "value": value}
            for i, (text, value) in enumerate(options)
        ],
    )


# --- the dashboard ---------------------------------------------------------------------------


def layout(rows: Sequence[core.RowPanel]) -> list[core.Panel]:
    """Place rows and their panels left to right, top to bottom, on Grafana's 24 columns.

    An open row is followed by its panels on the dashboard's top level; a collapsed row
    keeps them inside (Grafana's model for both)."""
    out: list[core.Panel] = []
    y = 0
    for r in rows:
        placed, bottom = _place(r.panels, y + 1)
        header = core.GridPos(h=1, w=GRID_WIDTH, x=0, y=y)
        if r.collapsed:
            out.append(attr.evolve(r, gridPos=header, panels=placed))
            y += 1
        else:
            out.append(attr.evolve(r, gridPos=header, panels=[]))
            out.extend(placed)
            y = bottom
    return out


def _place(panels: Sequence[core.Panel], top: int) -> tuple[list[core.Panel], int]:
    placed, x, y, line_height = [], 0, top, 0
    for p in panels:
        w, h = p.gridPos.w, p.gridPos.h
        if x + w > GRID_WIDTH:
            x, y, line_height = 0, y + line_height, 0
        placed.append(attr.evolve(p, gridPos=core.GridPos(h=h, w=w, x=x, y=y)))
        x += w
        line_height = max(line_height, h)
    return placed, y + line_height


def dashboard(
    title: str,
    uid: str,
    description: str,
    rows: Sequence[core.RowPanel],
    variables: Sequence[core.Template],
    *,
    tags: Sequence[str] = (),
    links: Sequence[dict[str, Any]] = (),
    time_from: str = "now-3h",
    refresh: str = "1m",
) -> core.Dashboard:
    return core.Dashboard(
        title=title,
        uid=uid,
        description=description,
        panels=layout(rows),
        templating=core.Templating(list=list(variables)),
        tags=list(tags),
        links=list(links),
        time=core.Time(time_from, "now"),
        refresh=refresh,
        timezone="browser",
        graphTooltip=1,
        editable=True,
    ).auto_panel_ids()


def link_to(title: str, uid: str, slug: str, tooltip: str = "") -> dict[str, Any]:
    """A dashboard link that carries the variables and the time range along."""
    return {
        "title": title,
        "type": "link",
        "url": f"/d/{uid}/{slug}",
        "icon": "dashboard",
        "tooltip": tooltip,
        "includeVars": True,
        "keepTime": True,
        "asDropdown": False,
        "targetBlank": False,
        "tags": [],
    }


def link_with(title: str, url: str, tooltip: str = "") -> dict[str, Any]:
    """A dashboard link to `url` (its variables set in the URL), keeping the time range."""
    return {**link_to(title, "", "", tooltip), "url": url, "includeVars": False}


def grafanalib_json(d: core.Dashboard) -> dict[str, Any]:
    """What grafanalib itself writes for `d`: schema 12, legacy keys, nulls."""
    return json.loads(json.dumps(d.to_json_data(), cls=DashboardEncoder))


def render(d: core.Dashboard) -> str:
    """The dashboard as committed: current Grafana model, sorted keys, trailing newline."""
    return to_json(modernize(grafanalib_json(d)))


# --- grafanalib's output -> the current dashboard model --------------------------------------

# Written by grafanalib for Grafana <= 6 and ignored (or migrated away) by current Grafana.
_LEGACY_ROOT = ("__inputs", "rows", "hideControls", "sharedCrosshair", "style", "gnetId")
_LEGACY_PANEL = ("editable", "error", "height", "minSpan", "span")
_LEGACY_TABLE = ("color", "columns", "fontSize", "mappings")
_LEGACY_TARGET = ("query", "target", "metric", "step", "intervalFactor", "hide")
_LEGACY_VARIABLE = ("auto", "auto_count", "auto_min", "useTags", "tagsQuery", "tagValuesQuery")
_ROW_KEYS = ("collapsed", "gridPos", "id", "panels", "title", "type")


def modernize(data: dict[str, Any]) -> dict[str, Any]:
    """grafanalib's schema-12 JSON -> the current dashboard model, without nulls."""
    data = {k: v for k, v in data.items() if k not in _LEGACY_ROOT}
    data["schemaVersion"] = SCHEMA_VERSION
    data["panels"] = [_panel(p) for p in data["panels"]]
    data["templating"] = {"list": [_variable(v) for v in data["templating"]["list"]]}
    picker = data.get("timepicker", {})
    data["timepicker"] = {"refresh_intervals": picker.get("refresh_intervals", [])}
    return _without_nulls(data)


def _panel(p: dict[str, Any]) -> dict[str, Any]:
    if p["type"] == "row":
        row_panel = {k: p[k] for k in _ROW_KEYS if k in p}
        row_panel["panels"] = [_panel(child) for child in p.get("panels", [])]
        return row_panel
    p = {k: v for k, v in p.items() if k not in _LEGACY_PANEL}
    if p["type"] == "table":
        p = {k: v for k, v in p.items() if k not in _LEGACY_TABLE}
    if not p.get("repeat"):
        for key in ("repeat", "repeatDirection", "maxPerRow"):
            p.pop(key, None)
    # grafanalib caps every panel at 100 points; Grafana's default follows the panel width.
    p.pop("maxDataPoints", None)
    for key, empty in (
        ("links", []),
        ("transformations", []),
        ("transparent", False),
        ("hideTimeOverride", False),
        ("description", ""),
        ("interval", ""),
    ):
        if p.get(key) == empty:
            p.pop(key)
    p["datasource"] = DATASOURCE
    p["targets"] = [_target(t) for t in p.get("targets", [])]
    field_config = p.setdefault("fieldConfig", {})
    field_config.setdefault("defaults", {})
    field_config.setdefault("overrides", [])
    steps = field_config["defaults"].get("thresholds", {}).get("steps")
    if not steps:
        field_config["defaults"]["thresholds"] = {
            "mode": "absolute",
            "steps": threshold_steps(None),
        }
    return p


def _target(t: dict[str, Any]) -> dict[str, Any]:
    t = {k: v for k, v in t.items() if k not in _LEGACY_TARGET}
    if not t.get("interval"):
        t.pop("interval", None)
    t["range"] = not t.get("instant", False)
    t["editorMode"] = "code"
    t["datasource"] = DATASOURCE
    return t


def _variable(v: dict[str, Any]) -> dict[str, Any]:
    v = {k: val for k, val in v.items() if k not in _LEGACY_VARIABLE}
    current = v.get("current") or {}
    if current.get("value") is None:
        v.pop("current", None)
    else:
        v["current"] = {"text": current["text"], "value": current["value"]}
    if v["type"] == "datasource":
        for key in ("datasource", "allValue", "regex"):
            v.pop(key, None)
    return v


def _without_nulls(value: Any) -> Any:
    """Drop null members, except `value`: a threshold step's null value means -Infinity."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None or k == "value"}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value

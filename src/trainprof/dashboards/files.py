"""The committed dashboards: which module builds each file (`DASHBOARDS`), its JSON text
(`render`), and the panels and queries of a dashboard's JSON."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainprof.contract.names import COMPARE_DASHBOARD, FLEET_DASHBOARD, JOB_DASHBOARD
from trainprof.rules.compiler import Compiled
from trainprof.rules.config import RulesConfig


def _job(config: RulesConfig, compiled: Compiled | None) -> Any:
    from trainprof.dashboards import job

    return job.dashboard(config, compiled)


def _fleet(config: RulesConfig, compiled: Compiled | None) -> Any:
    from trainprof.dashboards import fleet

    return fleet.dashboard(config, compiled)


def _compare(config: RulesConfig, compiled: Compiled | None) -> Any:
    from trainprof.dashboards import compare

    return compare.dashboard(config, compiled)


DASHBOARDS: dict[str, Callable[[RulesConfig, Compiled | None], Any]] = {
    JOB_DASHBOARD.file: _job,
    FLEET_DASHBOARD.file: _fleet,
    COMPARE_DASHBOARD.file: _compare,
}


def render(path: str, config: RulesConfig, compiled: Compiled | None = None) -> str:
    """The JSON text of the dashboard committed at `path`; `compiled` is `config` compiled,
    if the caller has it already."""
    from trainprof.dashboards import panels

    return panels.render(DASHBOARDS[path](config, compiled))


def iter_panels(data: dict):
    """Every panel of a dashboard's JSON, rows' nested panels included."""
    for p in data["panels"]:
        yield p
        yield from p.get("panels", [])


def panel_queries(data: dict) -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every query of a dashboard's JSON."""
    return [
        (p["title"], t.get("refId", ""), t["expr"])
        for p in iter_panels(data)
        for t in p.get("targets", [])
    ]

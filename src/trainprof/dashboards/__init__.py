"""Grafana dashboards, generated from the rule catalog and committed under `dashboards/`.

    >>> [path.split("/")[1] for path in sorted(DASHBOARDS)]
    ['trainprof-compare.json', 'trainprof-fleet.json', 'trainprof-job.json']

Each module builds one dashboard from a rule configuration (the committed files use
SageMaker's default ProfilerReport); `panels` is the house style over grafanalib and the
only module that imports it.
"""

from trainprof.dashboards.files import DASHBOARDS, iter_panels, panel_queries, render

__all__ = ["DASHBOARDS", "iter_panels", "panel_queries", "render"]

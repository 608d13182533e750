"""`trainprof report`: SageMaker's profiling report as one self-contained HTML file.

    trainprof report --prometheus http://prometheus:9090 --job bert-base -o report.html
    trainprof report --replay profiler-output/ --rules rules.yaml -o report.html
    trainprof report --replay debug-output/ -o report.html     # a tensor trial

The numbers come from the job dashboard's own queries (`dashboards.exprs`), run against
Prometheus or over a replay through promtool's rule engine; `collect` gets them, `build`
arranges them in SageMaker's sections, `page` writes the file.
"""

from __future__ import annotations

from trainprof.report.build import Report, build
from trainprof.report.collect import (
    Collected,
    ReportError,
    from_prometheus,
    from_replay,
    from_trial,
)
from trainprof.report.page import render

__all__ = [
    "Collected",
    "Report",
    "ReportError",
    "build",
    "from_prometheus",
    "from_replay",
    "from_trial",
    "render",
]

"""`trainprof replay`: which rules would have fired on a recorded job, and when.

The recorded samples become the series an exporter would have served, scraped every
`scrape_interval`; the compiled rules (the same PromQL `trainprof rules compile` writes) are
evaluated over them by promtool's real rule engine, `for:` included.

    >>> result = replay("profiler-output/", "rules.yaml", scrape_interval=15)   # doctest: +SKIP
    >>> result.rules["LowGPUUtilization"].fired                                 # doctest: +SKIP
    True
"""

from trainprof.replay.evaluate import query_step, replay
from trainprof.replay.load import FORMATS, detect_format, load_timeline
from trainprof.replay.result import (
    FiredAlert,
    Query,
    QueryBuilder,
    ReplayError,
    ReplayResult,
    Samples,
    Verdict,
    reads_training,
)

__all__ = [
    "FORMATS",
    "FiredAlert",
    "Query",
    "QueryBuilder",
    "ReplayError",
    "ReplayResult",
    "Samples",
    "Verdict",
    "detect_format",
    "load_timeline",
    "query_step",
    "reads_training",
    "replay",
]

"""`trainprof replay`: which rules would have fired on a recorded job, and when.

The recorded samples become the series an exporter would have served, scraped every
`scrape_interval`; the compiled rules (the same PromQL `trainprof rules compile` writes) are
evaluated over them by promtool's real rule engine, `for:` included.

    >>> job = "tests/data/real-sagemaker/trimcrae-8xtt-redock"  # its profiler-output/ is below
    >>> result = replay(job, None, scrape_interval=15)  # None: the default rules, compiled
    >>> result.rules["LowGPUUtilization"].fired, result.rules["CPUBottleneck"].fired
    (True, False)
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

"""trainprof's exporter: host and GPU samples every datapoint interval, served on /metrics.

From the command line, `trainprof exporter --web.listen-address :9945` (`--help` lists the
node_exporter-style flags). Inside a training process, on local rank 0:

    import trainprof.exporter

    exporter = trainprof.exporter.start(port=9945)      # returns at once; NVML opens in the
    ...                                                  # sampler thread, not here
    exporter.stop()

    # or into the training API's own registry, without a second port:
    exporter = trainprof.exporter.start(port=None, registry=my_registry)

Layout: `sources/` reads psutil and NVML into a `HostSample`; `collector.SourceRunner` adds
per-source health; `sampler.Sampler` folds each sample into the shared `SampleAccumulator`;
`exposition` renders a scrape body at most once per sample; `server` serves it.
"""

from trainprof.exporter.server import DEFAULT_PORT
from trainprof.exporter.startup import (
    DEFAULT_INTERVAL,
    SOURCE_TIMEOUT,
    Exporter,
    rules_inputs,
    start,
)

__all__ = [
    "DEFAULT_INTERVAL",
    "DEFAULT_PORT",
    "SOURCE_TIMEOUT",
    "Exporter",
    "rules_inputs",
    "start",
]

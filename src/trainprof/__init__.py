"""trainprof: SageMaker Debugger's profiler rules for any training job Prometheus can see.

Importing the package is cheap and needs only prometheus-client. In a training script:

    import trainprof
    trainprof.start()                        # serves this rank's /metrics
    for batch in trainprof.data(loader):     # phase "dataloader"
        with trainprof.step():
            with trainprof.phase("forward"): ...
"""

from trainprof._version import __version__
from trainprof.training.session import (
    add,
    current,
    data,
    log_loss,
    log_metric,
    phase,
    start,
    step,
    stop,
)

__all__ = [
    "__version__",
    "add",
    "current",
    "data",
    "log_loss",
    "log_metric",
    "phase",
    "start",
    "step",
    "stop",
]

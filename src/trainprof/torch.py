"""`trainprof.torch.watch`: the reductions SageMaker Debugger's tensor rules need, live.

The public face of `trainprof.training.watch`, which holds the implementation:

    import trainprof, trainprof.torch
    watcher = trainprof.torch.watch(model, optimizer, save_interval=100)
"""

from trainprof.training.watch import COLLECTIONS, DEFAULT_SAVE_INTERVAL, Watcher, watch

__all__ = ["COLLECTIONS", "DEFAULT_SAVE_INTERVAL", "Watcher", "watch"]

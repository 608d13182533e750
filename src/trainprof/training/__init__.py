"""The training side: what runs inside the training process (`trainprof.start()`,
steps and phases, the rank's /metrics, `watch()`'s reductions, the step recording)."""

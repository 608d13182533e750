"""Callbacks that time framework training loops with the trainprof API.

    from trainprof.integrations.lightning import TrainprofCallback     # PyTorch Lightning
    from trainprof.integrations.huggingface import TrainprofCallback   # transformers.Trainer
    from trainprof.integrations.keras import TrainprofCallback         # Keras 3

Each module imports its framework; this package imports none. Each callback starts the
session (`trainprof.start(**start_kwargs)`) unless the script already did, so identity,
ports and the rest work as in a plain loop.
"""

"""trainprof: SageMaker Debugger's profiler rules for any training job Prometheus can see.

Importing the package is cheap and needs only prometheus-client.
"""

from trainprof._version import __version__

__all__ = ["__version__"]

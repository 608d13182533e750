"""Kernel-level view of PyTorch profiler (Kineto) traces: what SageMaker Profiler's dashboard
showed (GPU active time, top kernels, precision, activities, memory operations, steps,
annotations), offline from trace files and live from `trainprof.start(kernel_profile=...)`.

    from trainprof.trace import read_trace, summarize
    summarize(read_trace("rank0.pt.trace.json.gz"))["gpu_time_seconds"]
    # {'compute': 0.108338822, 'communication': 0.039190669, 'compute+communication': ...}
"""

from trainprof.trace.load import Trace, TraceError, read_trace
from trainprof.trace.summary import summarize, summarize_all

__all__ = ["Trace", "TraceError", "read_trace", "summarize", "summarize_all"]

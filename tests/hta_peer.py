"""The peer side of the trace-summary comparison: Holistic Trace Analysis alone, run as
`python tests/hta_peer.py TRACE [--include-last-step] [--hta-rounding]` in its own process,
printing JSON. It imports nothing from trainprof, so it cannot agree with trainprof by sharing
its code.

HTA is run as users run it: `TraceAnalysis(trace_dir)`, which leaves the last profiler step
out (`include_last_profiler_step=False`), or with `--include-last-step` the whole trace.
Unless `--hta-rounding`, its rounding of nanosecond timestamps to whole microseconds is off
(HTA_DISABLE_NS_ROUNDING=1), so both sides measure the same events with the same clock;
test_trace_hta.py shows what the rounding changes.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import warnings


def main(path: str, include_last_step: bool, rounding: bool) -> dict:
    if not rounding:
        os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    from hta.trace_analysis import TraceAnalysis

    with tempfile.TemporaryDirectory() as trace_dir:
        shutil.copy(path, trace_dir)
        if include_last_step:
            analysis = TraceAnalysis(trace_dir=trace_dir, include_last_profiler_step=True)
        else:
            analysis = TraceAnalysis(trace_dir=trace_dir)  # HTA's default window
        temporal = analysis.get_temporal_breakdown(visualize=False)
        kernel_types, kernels = analysis.get_gpu_kernel_breakdown(
            visualize=False,
            include_memory_kernels=True,
            num_kernels=1_000_000,  # no "others" bucket: every kernel by name
            duration_ratio=1.0,
        )
    row = temporal.iloc[0]
    kernels = kernels.sort_values(by=["sum (us)", "name"], ascending=[False, True])
    return {
        "rank": int(row["rank"]),
        "kernel_time_us": float(row["kernel_time(us)"]),
        "idle_time_us": float(row["idle_time(us)"]),
        "compute_time_us": float(row["compute_time(us)"]),
        "non_compute_time_us": float(row["non_compute_time(us)"]),
        "kernel_type_us": {
            str(k): float(v) for k, v in zip(kernel_types.kernel_type, kernel_types["sum"])
        },
        "kernels": [
            {"name": str(n), "sum_us": float(s), "type": str(t)}
            for n, s, t in zip(kernels["name"], kernels["sum (us)"], kernels["kernel_type"])
        ],
    }


if __name__ == "__main__":
    flags = sys.argv[2:]
    result = main(sys.argv[1], "--include-last-step" in flags, "--hta-rounding" in flags)
    json.dump(result, sys.stdout)

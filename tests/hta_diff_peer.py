"""The peer side of the trace-diff comparison: Holistic Trace Analysis' own trace diff
(`hta.trace_diff.TraceDiff`) alone, run as `python tests/hta_diff_peer.py A B
[--include-last-step]` in its own process, printing JSON. It imports nothing from trainprof,
so it cannot agree with trainprof by sharing its code.

HTA is run as its users run TraceDiff over a window of steps: on each trace's first rank,
with the iterations HTA finds (`LabeledTrace.iterations()`) less the last one, which HTA
leaves out by default because the profiler usually cuts it short (with
`--include-last-step`, all of them). Its rounding of nanosecond timestamps to whole
microseconds is off (HTA_DISABLE_NS_ROUNDING=1), so both sides measure the same events
with the same clock. For each device type (GPU, CPU) it prints every name TraceDiff
compares: its category (from HTA's ops summary), counts and total durations (us), and the
name's change category from `TraceDiff.ops_diff`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import warnings


def main(path_a: str, path_b: str, include_last_step: bool) -> dict:
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    from hta.trace_diff import DeviceType, LabeledTrace, TraceDiff

    out: dict = {}
    with tempfile.TemporaryDirectory() as top:
        traces = []
        for label, path in (("control", path_a), ("test", path_b)):
            folder = os.path.join(top, label)
            os.mkdir(folder)
            shutil.copy(path, folder)
            traces.append(LabeledTrace(label=label, trace_dir=folder))
        iterations = []
        for t in traces:
            found = t.iterations()
            iterations.append(found if include_last_step or len(found) < 2 else found[:-1])
        out["iterations"] = iterations
        for device, name in ((DeviceType.GPU, "gpu"), (DeviceType.CPU, "cpu")):
            compared = TraceDiff.compare_traces(
                traces[0],
                traces[1],
                control_iteration=iterations[0],
                test_iteration=iterations[1],
                device_type=device,
            )
            changes = TraceDiff.ops_diff(
                traces[0],
                traces[1],
                control_iteration=iterations[0],
                test_iteration=iterations[1],
                device_type=device,
            )
            category = {}
            for t, its in zip(traces, iterations):
                ops = t.get_ops_summary(t.extract_ops(None, its, device))
                category.update(dict(zip(ops["name"], ops["cat"])))
            change_of = {n: c for c, names in changes.items() for n in names}
            out[name] = {
                str(n): {
                    "cat": str(category.get(n, "")),
                    "control_count": float(row["control_counts"]),
                    "test_count": float(row["test_counts"]),
                    "control_us": float(row["control_total_duration"]),
                    "test_us": float(row["test_total_duration"]),
                    "change": change_of.get(n, ""),
                }
                for n, row in compared.iterrows()
            }
    return out


if __name__ == "__main__":
    flags = sys.argv[3:]
    json.dump(main(sys.argv[1], sys.argv[2], "--include-last-step" in flags), sys.stdout)

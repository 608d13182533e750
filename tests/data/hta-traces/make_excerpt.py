"""Cut HTA's V100 ResNet test trace to its first two profiler steps (how
`v100-resnet-2steps.pt.trace.json.gz` was made; see README.md).

    python make_excerpt.py rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz OUT.pt.trace.json.gz

Kept, unchanged: every metadata field and `M` event; host events that start before
ProfilerStep#103 begins; the GPU events launched by a kept host call (paired by
`correlation`); GPU annotations that start before the last kept GPU event ends; the flow
events of kept launches. Nothing else is edited. Uses only the standard library.
"""

import gzip
import json
import sys

DEVICE = {"kernel", "gpu_memcpy", "gpu_memset"}


def excerpt(doc: dict, first_left_out: str) -> dict:
    events = doc["traceEvents"]
    cutoff = next(e["ts"] for e in events if e.get("name") == first_left_out)
    host = [
        e
        for e in events
        if e.get("ph") in ("X", "i")
        and e.get("cat") not in DEVICE | {"gpu_user_annotation", "Trace"}
        and e["ts"] < cutoff
    ]
    launched = {
        e["args"]["correlation"]
        for e in host
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    device = [
        e
        for e in events
        if e.get("cat") in DEVICE and e.get("args", {}).get("correlation") in launched
    ]
    device_end = max(e["ts"] + e["dur"] for e in device)
    annotations = [
        e for e in events if e.get("cat") == "gpu_user_annotation" and e["ts"] < device_end
    ]
    flows = [
        e
        for e in events
        if e.get("ph") in ("s", "f")
        and (e.get("id") in launched if e.get("cat") == "ac2g" else e["ts"] < cutoff)
    ]
    other = [e for e in events if e.get("ph") == "M" or e.get("cat") == "Trace"]
    kept = {id(e) for e in host + device + annotations + flows + other}
    return {**doc, "traceEvents": [e for e in events if id(e) in kept]}


if __name__ == "__main__":
    source, target = sys.argv[1], sys.argv[2]
    with gzip.open(source, "rt") as f:
        doc = json.load(f)
    with gzip.open(target, "wt", compresslevel=9) as f:
        json.dump(excerpt(doc, "ProfilerStep#103"), f)

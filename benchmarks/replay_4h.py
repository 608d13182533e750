"""Replay a 4-hour, 2-node, 8-GPU SageMaker timeline and time each stage.

    python benchmarks/replay_4h.py [--hours 4] [--scrape-interval 15s] [--keep DIR]

Prints the time to write the synthetic profiler output (not part of replay), to read it,
to build the scraped series, and to evaluate the rules with promtool, plus peak RSS.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time

from trainprof.contract.durations import parse_duration
from trainprof.replay import replay
from trainprof.replay.synthetic import write_system


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hours", type=float, default=4)
    parser.add_argument("--scrape-interval", default="15s")
    parser.add_argument("--cores", type=int, default=16)
    parser.add_argument("--keep")
    args = parser.parse_args()
    out = args.keep or tempfile.mkdtemp(prefix="replay4h-")
    duration = args.hours * 3600
    gpu_pattern = {"cycle": [0.95] * 9 + [0.0]}
    hosts = {
        "algo-1": {
            "cores": args.cores,
            "gpus": 8,
            "timeline": [
                {"gpu_util": gpu_pattern, "cpu": 0.5},
                {"from": duration / 2, "gpu_util": 0.3, "cpu": 0.95},
            ],
        },
        "algo-2": {
            "cores": args.cores,
            "gpus": 8,
            "timeline": [{"gpu_util": 0.92, "gpu_mem": 0.6, "cpu": 0.4}],
        },
    }
    t = time.perf_counter()
    lines = write_system(out, start=1_700_000_000, duration=duration, interval=0.5, hosts=hosts)
    print(f"wrote {lines:,} SageMaker lines in {time.perf_counter() - t:.1f}s to {out}")
    t = time.perf_counter()
    result = replay(out, None, scrape_interval=parse_duration(args.scrape_interval))
    elapsed = time.perf_counter() - t
    fired = {k: len(v.alerts) for k, v in result.rules.items() if v.fired}
    print(
        f"replayed {result.samples:,} samples ({result.nodes} nodes, {result.gpus} GPUs, "
        f"{args.hours:g} h) at {args.scrape_interval} in {elapsed:.1f}s; fired: {fired}"
    )
    print(
        f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB "
        f"(children {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MB)"
    )


if __name__ == "__main__":
    main()

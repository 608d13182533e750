"""Seconds of replay per job-hour at 1 s and 15 s scrapes, for 1, 2 and 4 hour jobs.

    python benchmarks/replay_scale.py [--hours 1 2 4] [--scrape 1s 15s] [--keep DIR]
        [--source dcgm,node_exporter [--collect 30s]] [--chunk-instants N]

The job is replay_4h.py's (2 nodes x 8 GPUs x 16 cores, SageMaker layout, 0.5 s samples).
Each replay runs in its own process, so its peak RSS is its own; CPU seconds (replay's
process plus promtool) are given beside wall seconds, as the machine may be shared.
Linear replay shows as a constant seconds-per-job-hour down each column; peak RSS is
the replay process's and the largest of its promtool runs' (a long job is evaluated in
chunks of --chunk-instants scrapes, trainprof.replay.chunks; 0: in one promtool run, as
before chunking). The chunks column says how many promtool runs the replay made.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from trainprof.replay.chunks import CHUNK_INSTANTS
from trainprof.replay.synthetic import write_system

CHILD = r"""
import hashlib, json, resource, sys, time
from trainprof.replay import replay
from trainprof.contract.durations import parse_duration
t = time.perf_counter()
sources = tuple(sys.argv[3].split(",")) if sys.argv[3] else None
collect = parse_duration(sys.argv[4]) if sys.argv[4] else None
chunk = int(sys.argv[5])
result = replay(sys.argv[1], None, scrape_interval=parse_duration(sys.argv[2]),
                sources=sources, collect_interval=collect, chunk_instants=chunk)
wall = time.perf_counter() - t
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({
    "wall": wall,
    "cpu": me.ru_utime + me.ru_stime,
    "promtool_cpu": kids.ru_utime + kids.ru_stime,
    "rss_mb": me.ru_maxrss / 1024,
    "promtool_rss_mb": kids.ru_maxrss / 1024,
    "fired": sorted(k for k, v in result.rules.items() if v.fired),
    "chunks": result.chunks,
    "verdicts": hashlib.sha256(json.dumps(result.as_json()).encode()).hexdigest()[:12],
}))
"""


def job(out: str, hours: float) -> None:
    duration = hours * 3600
    hosts = {
        "algo-1": {
            "cores": 16,
            "gpus": 8,
            "timeline": [
                {"gpu_util": {"cycle": [0.95] * 9 + [0.0]}, "cpu": 0.5},
                {"from": duration / 2, "gpu_util": 0.3, "cpu": 0.95},
            ],
        },
        "algo-2": {
            "cores": 16,
            "gpus": 8,
            "timeline": [{"gpu_util": 0.92, "gpu_mem": 0.6, "cpu": 0.4}],
        },
    }
    write_system(out, start=1_700_000_000, duration=duration, interval=0.5, hosts=hosts)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hours", type=float, nargs="+", default=[1, 2, 4])
    parser.add_argument("--scrape", nargs="+", default=["15s", "1s"])
    parser.add_argument("--keep")
    parser.add_argument("--source", default="", help="replay --source (default: trainprof)")
    parser.add_argument("--collect", default="", help="replay --collect-interval")
    parser.add_argument(
        "--chunk-instants",
        type=int,
        default=CHUNK_INSTANTS,
        help="scrapes per promtool run (0: the whole job in one run)",
    )
    args = parser.parse_args()
    base = args.keep or tempfile.mkdtemp(prefix="replay-scale-")
    print(
        "| job | scrape | wall s | s per job-hour | CPU s (replay + promtool) | "
        "CPU s per job-hour | peak RSS replay / promtool | chunks | JSON sha256 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for hours in args.hours:
        out = os.path.join(base, f"{hours:g}h")
        if not os.path.isdir(out):
            job(out, hours)
        for scrape in args.scrape:
            run = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    CHILD,
                    out,
                    scrape,
                    args.source,
                    args.collect,
                    str(args.chunk_instants),
                ],
                capture_output=True,
                text=True,
            )
            if run.returncode != 0:
                sys.exit(f"replay of {out} at {scrape} failed:\n{run.stderr[-3000:]}")
            r = json.loads(run.stdout.strip().splitlines()[-1])
            cpu = r["cpu"] + r["promtool_cpu"]
            print(
                f"| {hours:g} h | {scrape} | {r['wall']:.1f} | {r['wall'] / hours:.1f} | "
                f"{r['cpu']:.1f} + {r['promtool_cpu']:.1f} | {cpu / hours:.1f} | "
                f"{r['rss_mb']:.0f} / {r['promtool_rss_mb']:.0f} MB | {r['chunks']} | "
                f"{r['verdicts']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

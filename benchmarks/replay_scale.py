"""Seconds of replay per job-hour at 1 s and 15 s scrapes, for 1, 2 and 4 hour jobs.

    python benchmarks/replay_scale.py [--hours 1 2 4] [--scrape 1s 15s] [--keep DIR]
        [--source dcgm,node_exporter [--collect 30s]] [--chunk-instants N] [--rounds 3]
        [--markdown]

The job is replay_4h.py's (2 nodes x 8 GPUs x 16 cores, SageMaker layout, 0.5 s samples).
Each replay runs in its own process, so its peak RSS is its own; CPU seconds (replay's
process plus promtool) are given beside wall seconds, as the machine may be shared.
Linear replay shows as a constant seconds-per-job-hour down each column; peak RSS is
the replay process's and the largest of its promtool runs' (a long job is evaluated in
chunks of --chunk-instants scrapes, trainprof.replay.chunks; 0: in one promtool run, as
before chunking). The chunks column says how many promtool runs the replay made.

"x promtool" is (replay's CPU + promtool's) / promtool's: what replay costs against promtool
alone evaluating the very files replay wrote (its runs are replay's only child processes).
"x real time" is the job's length over replay's wall time, and over the CPU time of replay
and promtool together (the figure a shared machine does not inflate). With --rounds, every
configuration runs once per round, interleaved; each cell is the median (min-max) of the
rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from _interleave import Spread, caption

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
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--markdown", action="store_true", help="a table for the README")
    args = parser.parse_args()
    base = args.keep or tempfile.mkdtemp(prefix="replay-scale-")
    configs = [(hours, scrape) for hours in args.hours for scrape in args.scrape]
    for hours in args.hours:
        out = os.path.join(base, f"{hours:g}h")
        if not os.path.isdir(out):
            job(out, hours)
    runs: dict[tuple, list[dict]] = {c: [] for c in configs}
    for _ in range(args.rounds):
        for hours, scrape in configs:
            runs[(hours, scrape)].append(replay_once(args, base, hours, scrape))
    what = (
        f"replay_scale.py: 2 nodes x 8 GPUs x 16 cores, 0.5 s samples, source "
        f"{args.source or 'trainprof'}, {args.rounds} interleaved round(s)"
    )
    print(caption(what) + ("\n" if args.markdown else ""))
    print(
        "| job | scrape | wall s | x real time (wall / CPU) | CPU s replay + promtool | "
        "x promtool | peak RSS replay / promtool | chunks | JSON sha256 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for hours, scrape in configs:
        rs = runs[(hours, scrape)]
        wall = Spread(r["wall"] for r in rs)
        real = Spread(hours * 3600 / r["wall"] for r in rs)
        per_cpu = Spread(hours * 3600 / (r["cpu"] + r["promtool_cpu"]) for r in rs)
        cpu = Spread(r["cpu"] for r in rs)
        promtool = Spread(r["promtool_cpu"] for r in rs)
        ratio = Spread((r["cpu"] + r["promtool_cpu"]) / r["promtool_cpu"] for r in rs)
        rss = Spread(r["rss_mb"] for r in rs)
        prss = Spread(r["promtool_rss_mb"] for r in rs)
        shas = sorted({r["verdicts"] for r in rs})
        print(
            f"| {hours:g} h | {scrape} | {wall.cell('{:.1f}')} | {real.cell('{:.0f}')} / "
            f"{per_cpu.cell('{:.0f}')} | "
            f"{cpu.median:.1f} + {promtool.median:.1f} | {ratio.cell('{:.2f}')} | "
            f"{rss.median:.0f} / {prss.median:.0f} MB | {rs[0]['chunks']} | "
            f"{', '.join(shas)} |",
            flush=True,
        )


def replay_once(args: argparse.Namespace, base: str, hours: float, scrape: str) -> dict:
    out = os.path.join(base, f"{hours:g}h")
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
    return json.loads(run.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()

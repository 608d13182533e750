"""How far the verdicts on dcgm-exporter and node_exporter agree with trainprof's own exporter.

    python benchmarks/source_agreement.py [--scrape 15s] [--collect 1s 15s 30s] [--json FILE]
                                          [--exporter-reads-dcgm]

Each timeline (the real SageMaker outputs in tests/data/real-sagemaker and synthetic SageMaker
jobs written here, as the tests write them) is replayed with `--source trainprof`, then with
`--source dcgm,node_exporter` at each dcgm-exporter collection interval. Per rule: on how many
timelines the two agree on fired or quiet, and by how much the first firing moves (dcgm minus
trainprof, seconds) where both fire. A rule that is no_data or not_applicable under both is
left out of its count. Prints a Markdown table for benchmarks/README.md.

With --exporter-reads-dcgm the other side is trainprof's exporter reading its GPUs from a
dcgm-exporter collecting at each interval (`--collector.gpu.dcgm-exporter`; replay's
`--source trainprof --collect-interval`): the trainprof rules on held GPU readings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from trainprof.contract.durations import parse_duration
from trainprof.replay import replay
from trainprof.replay.synthetic import write_steps, write_system

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT / "tests" / "data" / "real-sagemaker"
REAL = {
    "real: 8xtt-redock (12 min, 1 GPU)": SHARED / "trimcrae-8xtt-redock",
    "real: rarecancers-metad-r1 (1 min)": SHARED / "trimcrae-rarecancers-metad-r1",
    "real: smdebug test_traces (32 cores)": SHARED
    / "smdebug-test-resources/tests/profiler/resources/test_traces",
}
START = 1_700_000_000

# name -> (minutes, hosts) in trainprof.replay.synthetic's notation (ratios 0..1).
SYNTHETIC = {
    "starved GPU, busy core": (
        16,
        {
            "algo-1": {
                "cores": 4,
                "gpus": 2,
                "timeline": [{"gpu_util": [0.03, 0.9], "cpu": [0.97, 0.3, 0.3, 0.3]}],
            }
        },
    ),
    "healthy": (16, {"algo-1": {"cores": 4, "gpus": 2, "timeline": [{"gpu_util": 0.9}]}}),
    "I/O wait, idle GPU": (
        16,
        {
            "algo-1": {
                "cores": 4,
                "gpus": 1,
                "timeline": [{"gpu_util": 0.05, "iowait": [0.6, 0.0, 0.0, 0.0], "cpu": 0.2}],
            }
        },
    ),
    "low GPU, idle CPU": (
        16,
        {"algo-1": {"cores": 4, "gpus": 1, "timeline": [{"gpu_util": 0.2, "cpu": 0.2}]}},
    ),
    "two starved nodes": (
        16,
        {
            n: {"cores": 2, "gpus": 1, "timeline": [{"gpu_util": 0.02, "cpu": 0.97}]}
            for n in ("algo-1", "algo-2")
        },
    ),
    "5 s GPU stalls every 5 s": (
        20,
        {
            "algo-1": {
                "cores": 4,
                "gpus": 1,
                "timeline": [{"gpu_util": {"cycle": [0.95] * 9 + [0.0]}, "cpu": 0.5}],
            }
        },
    ),
    "30 s starved / 30 s busy": (
        20,
        {
            "algo-1": {
                "cores": 4,
                "gpus": 1,
                "timeline": [
                    {
                        "gpu_util": {"cycle": [0.02] * 60 + [0.95] * 60},
                        "cpu": {"cycle": [0.97] * 60 + [0.4] * 60},
                    }
                ],
            }
        },
    ),
    "half-time slowdown": (
        30,
        {
            "algo-1": {
                "cores": 8,
                "gpus": 4,
                "timeline": [
                    {"gpu_util": {"cycle": [0.95] * 9 + [0.0]}, "cpu": 0.5},
                    {"from": 900, "gpu_util": 0.3, "cpu": 0.95},
                ],
            }
        },
    ),
    "GPU memory growing": (
        16,
        {
            "algo-1": {
                "cores": 4,
                "gpus": 1,
                "timeline": [
                    {"gpu_mem": 0.2},
                    {"from": 300, "gpu_mem": 0.5},
                    {"from": 600, "gpu_mem": 0.9},
                ],
            }
        },
    ),
    "imbalanced GPUs": (
        16,
        {
            "algo-1": {
                "cores": 4,
                "gpus": 4,
                "timeline": [{"gpu_util": [0.95, 0.9, 0.15, 0.1], "cpu": 0.4}],
            }
        },
    ),
    "borderline GPU (p95 near 70%)": (
        16,
        {
            "algo-1": {
                "cores": 4,
                "gpus": 1,
                "timeline": [{"gpu_util": {"cycle": [0.6] * 18 + [0.9] * 2}, "cpu": 0.3}],
            }
        },
    ),
}


def write_synthetic(out: Path) -> dict[str, str]:
    jobs = {}
    for n, (name, (minutes, hosts)) in enumerate(SYNTHETIC.items()):
        job = out / f"job{n}"
        write_system(
            str(job / "profiler-output"),
            start=START,
            duration=minutes * 60,
            interval=0.5,
            hosts=hosts,
        )
        jobs[f"synthetic: {name}"] = str(job)
    # A job with ranks (framework traces): GPUs join it through the ranks' assignment.
    job = out / "job-steps"
    hosts = {"algo-1": {"cores": 4, "gpus": 2, "timeline": [{"gpu_util": 0.04, "cpu": 0.97}]}}
    write_system(str(job / "profiler-output"), start=START, duration=960, interval=0.5, hosts=hosts)
    for rank in (0, 1):
        steps = [
            ("train", START + 30 + 2 * i, START + 31.5 + 2 * i + (6 if i == 200 else 0))
            for i in range(400)
        ]
        write_steps(str(job / "profiler-output"), "algo-1", rank, steps)
    jobs["synthetic: starved, 2 ranks with steps"] = str(job)
    return jobs


def verdicts(source: str, scrape: float, sources: tuple[str, ...], collect: float | None):
    result = replay(source, None, scrape_interval=scrape, sources=sources, collect_interval=collect)
    out = {}
    for name, v in result.rules.items():
        status = v.status.status if v.status else "-"
        if v.status and v.status.reason.startswith("not compiled"):
            status = "left out"  # the compiler has no such rule for this source
        out[name] = (status, v.first_fired_at)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scrape", default="15s")
    parser.add_argument("--collect", nargs="+", default=["1s", "15s", "30s"])
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--exporter-reads-dcgm", action="store_true")
    args = parser.parse_args()
    other_sources = ("trainprof",) if args.exporter_reads_dcgm else ("dcgm", "node_exporter")
    scrape = parse_duration(args.scrape)
    collects = [parse_duration(c) for c in args.collect]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        timelines = {n: str(p) for n, p in REAL.items() if p.is_dir()}
        timelines.update(write_synthetic(Path(tmp)))
        for name, source in timelines.items():
            t = time.perf_counter()
            base = verdicts(source, scrape, ("trainprof",), None)
            seconds = {"trainprof": time.perf_counter() - t}
            for collect in collects:
                t = time.perf_counter()
                other = verdicts(source, scrape, other_sources, collect)
                seconds[f"{collect:g}s"] = time.perf_counter() - t
                for rule, (status, first) in base.items():
                    status2, first2 = other.get(rule, ("-", None))
                    rows.append(
                        {
                            "timeline": name,
                            "collect": collect,
                            "rule": rule,
                            "trainprof": status,
                            "dcgm": status2,
                            "shift": (first2 - first)
                            if first is not None and first2 is not None
                            else None,
                        }
                    )
            print(
                f"{name}: " + ", ".join(f"{k} {v:.1f}s" for k, v in seconds.items()),
                file=sys.stderr,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    other = "exporter over dcgm-exporter" if args.exporter_reads_dcgm else "dcgm,node_exporter"
    print_table(rows, collects, scrape, other)
    return 0


def _applies(status: str) -> bool:
    return status in ("fired", "quiet")


def print_table(rows: list[dict], collects: list[float], scrape: float, other: str) -> None:
    rules = list(dict.fromkeys(r["rule"] for r in rows))
    head = " | ".join(f"collect {c:g}s" for c in collects)
    print(f"Scrape every {scrape:g}s. Per rule and dcgm-exporter collection interval: timelines")
    print("agreeing on fired/quiet out of those where either source could decide, then the")
    print(f"first-firing shift ({other} minus trainprof; median, range) where both fired.")
    print()
    print(f"| rule | {head} |")
    print("|---|" + "---|" * len(collects))
    for rule in rules:
        cells = []
        for c in collects:
            mine = [r for r in rows if r["rule"] == rule and r["collect"] == c]
            decided = [r for r in mine if _applies(r["trainprof"]) or _applies(r["dcgm"])]
            agree = [r for r in decided if (r["trainprof"] == "fired") == (r["dcgm"] == "fired")]
            shifts = [r["shift"] for r in mine if r["shift"] is not None]
            cell = f"{len(agree)}/{len(decided)}" if decided else "-"
            if mine and all(r["dcgm"] == "left out" for r in mine):
                cell = "left out for dcgm"
            if shifts:
                cell += (
                    f"; {statistics.median(shifts):+.0f}s ({min(shifts):+.0f}..{max(shifts):+.0f})"
                )
            cells.append(cell)
        print(f"| {rule} | " + " | ".join(cells) + " |")
    print()
    print(f"Disagreements (timeline, collect: trainprof -> {other}):")
    for r in rows:
        if (
            r["dcgm"] != "left out"
            and (_applies(r["trainprof"]) or _applies(r["dcgm"]))
            and ((r["trainprof"] == "fired") != (r["dcgm"] == "fired"))
        ):
            where = f"{r['timeline']}, {r['collect']:g}s"
            print(f"- {r['rule']}: {where}: {r['trainprof']} -> {r['dcgm']}")


if __name__ == "__main__":
    sys.exit(main())

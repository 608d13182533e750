"""SageMaker's clear-cut cases replayed on dcgm-exporter and node_exporter: how many reach
the original rules' verdict.

    python benchmarks/clear_cut_sources.py [--source dcgm,node_exporter] [--collect 30s]
                                           [--scrape 15s ...] [--json FILE]

The cases are tests/test_replay_agrees_with_original.py's (the same generators and seed:
a condition that holds the whole job with a wide margin, or is clearly absent), each checked
against the oracle of the original decisions (tests/original_rules.py). That test replays them
on trainprof's exporter, where every case must agree; here each is replayed with `--source`
(dcgm-exporter collecting every `--collect`) at each `--scrape`, and the table counts, per
rule, the cases whose verdict is the oracle's. A rule the source does not compile
(LoadBalancing on dcgm) is counted apart.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from trainprof.contract.durations import parse_duration
from trainprof.replay import load_timeline, replay
from trainprof.replay.synthetic import write_steps, write_system
from trainprof.rules.config import load_config
from trainprof.sources import parse_sources

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import random  # noqa: E402 - after the tests' folder is on the path

from original_rules import DECIDE  # noqa: E402
from test_replay_agrees_with_original import GENERATORS, START  # noqa: E402

SEED = 20261122  # the test's
PER_RULE = 6


def cases():
    """(rule, n, params, hosts, fires, datapoints), as the test draws them."""
    rng = random.Random(SEED)
    for rule, make in GENERATORS.items():
        for n in range(PER_RULE):
            yield (rule, n, *make(rng, n))


def write_case(root: Path, rule: str, params: dict, hosts: dict, fires: bool, datapoints: int):
    """The case's SageMaker output under `root`; asserts the oracle's verdict is `fires`."""
    interval = 0.5
    duration = datapoints * interval + 6 * 60
    out = root / "profiler-output"
    if "steps" in hosts:
        write_steps(str(out), "algo-1", 0, hosts["steps"])
        hosts = {"algo-1": {"cores": 2, "gpus": 1}}
    write_system(str(out), start=START, duration=duration, interval=interval, hosts=hosts)
    timeline, _ = load_timeline(str(root), "sagemaker", None)
    full = {**load_config({"rules": [rule]}).rule(rule).values, **params}
    evidence = timeline.steps if rule == "StepOutlier" else timeline.hosts
    if DECIDE[rule](evidence, full) != fires:
        raise SystemExit(f"{rule} {params}: the generated case is not clear-cut")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="dcgm,node_exporter", type=parse_sources)
    parser.add_argument("--collect", default="30s", type=parse_duration)
    parser.add_argument("--scrape", nargs="+", default=["15s"])
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()
    scrapes = [parse_duration(s) for s in args.scrape]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for rule, n, params, hosts, fires, datapoints in cases():
            job = Path(tmp) / f"{rule}-{n}"
            write_case(job, rule, params, hosts, fires, datapoints)
            config = {"rules": [{"rule": rule, "parameters": params}]}
            for scrape in scrapes:
                t = time.perf_counter()
                result = replay(
                    str(job),
                    load_config({**config, "scrape_interval": f"{scrape:g}s"}),
                    scrape_interval=scrape,
                    sources=args.source,
                    collect_interval=args.collect,
                )
                verdict = result.rules[rule]
                status = verdict.status.status if verdict.status else "-"
                if verdict.status and verdict.status.reason.startswith("not compiled"):
                    status = "left out"  # the compiler has no such rule for this source
                rows.append(
                    {
                        "case": f"{rule}-{n}",
                        "rule": rule,
                        "scrape": scrape,
                        "params": params,
                        "original": "fired" if fires else "quiet",
                        "replayed": "fired" if verdict.fired else status,
                    }
                )
                print(
                    f"{rule}-{n} at {scrape:g}s: {rows[-1]['original']} -> "
                    f"{rows[-1]['replayed']} ({time.perf_counter() - t:.1f}s)",
                    file=sys.stderr,
                )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print_table(rows, scrapes, ",".join(args.source), args.collect)
    return 0


def print_table(rows: list[dict], scrapes: list[float], source: str, collect: float) -> None:
    print(
        f"Clear-cut cases replayed with --source {source} --collect-interval {collect:g}s: "
        "cases reaching the original verdict, per scrape interval."
    )
    print()
    print("| rule | " + " | ".join(f"scrape {s:g}s" for s in scrapes) + " |")
    print("|---|" + "---|" * len(scrapes))
    for rule in dict.fromkeys(r["rule"] for r in rows):
        cells = []
        for s in scrapes:
            mine = [r for r in rows if r["rule"] == rule and r["scrape"] == s]
            if all(r["replayed"] == "left out" for r in mine):
                cells.append("not compiled for the source")
                continue
            agree = sum((r["replayed"] == "fired") == (r["original"] == "fired") for r in mine)
            cells.append(f"{agree}/{len(mine)}")
        print(f"| {rule} | " + " | ".join(cells) + " |")
    print()
    print("Disagreements:")
    for r in rows:
        if r["replayed"] != "left out" and (
            (r["replayed"] == "fired") != (r["original"] == "fired")
        ):
            where = f"{r['case']} at {r['scrape']:g}s {r['params']}"
            print(f"- {where}: {r['original']} -> {r['replayed']}")


if __name__ == "__main__":
    sys.exit(main())

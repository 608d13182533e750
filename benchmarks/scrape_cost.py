"""CPU per scrape and per 1,000 series: trainprof's exporter next to Debian's
prometheus-node-exporter, interleaved in one run on the same machine.

    python benchmarks/scrape_cost.py [--rounds 7] [--paced 20] [--burst 200] [--markdown]

trainprof runs with 8 fake H100s (the real NVML code against tests/fakes.py) and the real host
collectors; node_exporter with its defaults. Both run the whole time and are scraped the way
Prometheus scrapes (OpenMetrics accepted, gzip). Each round measures, for each exporter in
turn:

  background   its CPU over 2 s with no scrapes (trainprof samples every 0.5 s)
  paced        --paced scrapes, one per 0.5 s: every trainprof scrape finds a new sample and
               renders it (the worst case: a 0.5 s scrape interval)
  burst        --burst scrapes back to back: trainprof serves most from the cached body

CPU per scrape = (process CPU during the scrapes - background rate x their duration) / scrapes,
from /proc/PID/stat (10 ms ticks, hence the many scrapes). Reported: the median over the
rounds with min and max, and trainprof / node_exporter per 1,000 series taken round by round.
"""

from __future__ import annotations

import argparse
import time

from _interleave import Spread, caption, ratios
from _procs import (
    cpu_seconds,
    free_port,
    scrape,
    series,
    start_node_exporter,
    start_trainprof,
    stop,
    wait_ready,
)

IDLE = 2.0


def background(proc) -> float:
    """CPU seconds per second with nobody scraping."""
    c0, t0 = cpu_seconds(proc.pid), time.monotonic()
    time.sleep(IDLE)
    return (cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0)


def per_scrape(proc, url: str, count: int, pause: float, idle_rate: float) -> float:
    """CPU seconds per scrape beyond the background."""
    c0, t0 = cpu_seconds(proc.pid), time.monotonic()
    for _ in range(count):
        scrape(url)
        if pause:
            time.sleep(pause)
    elapsed = time.monotonic() - t0
    return max(cpu_seconds(proc.pid) - c0 - idle_rate * elapsed, 0.0) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--paced", type=int, default=20)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--markdown", action="store_true", help="a table for the README")
    args = parser.parse_args()

    exporters = {}
    try:
        for name, start in (
            ("trainprof (8 fake GPUs)", start_trainprof),
            ("node_exporter", start_node_exporter),
        ):
            port = free_port()
            proc = start(port)
            url = f"http://127.0.0.1:{port}/metrics"
            exporters[name] = (proc, url)
        for proc, url in exporters.values():
            wait_ready(url, proc)
        time.sleep(2)
        n_series = {name: series(scrape(url)) for name, (_, url) in exporters.items()}
        results: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for name, (proc, url) in exporters.items():
                idle = background(proc)
                results.setdefault(f"{name} background", []).append(idle)
                for mode, count, pause in (("paced", args.paced, 0.5), ("burst", args.burst, 0)):
                    cpu = per_scrape(proc, url, count, pause, idle)
                    results.setdefault(f"{name} {mode}", []).append(cpu / n_series[name] * 1e3)
    finally:
        for proc, _ in exporters.values():
            stop(proc)

    what = (
        f"scrape_cost.py: CPU ms per 1,000 series served, {args.rounds} interleaved rounds "
        f"({args.paced} paced + {args.burst} back-to-back scrapes each)"
    )
    print(caption(what) + ("\n" if args.markdown else ""))
    ours, theirs = "trainprof (8 fake GPUs)", "node_exporter"
    if args.markdown:
        print(
            "| scrapes | trainprof, ms / 1,000 series | node_exporter, ms / 1,000 series | "
            "trainprof / node_exporter |"
        )
        print("|---|---|---|---|")
    for mode in ("paced", "burst"):
        a, b = results[f"{ours} {mode}"], results[f"{theirs} {mode}"]
        ratio = ratios({"a": a, "b": b}, "a", "b") if all(b) else None
        cells = (
            Spread(x * 1e3 for x in a).cell("{:.3f}"),
            Spread(x * 1e3 for x in b).cell("{:.3f}"),
            ratio.cell("{:.2f}") if ratio else "n/a (node_exporter below the 10 ms tick)",
        )
        if args.markdown:
            print(f"| {mode} | " + " | ".join(cells) + " |")
        else:
            print(f"{mode}: trainprof {cells[0]}, node_exporter {cells[1]}, ratio {cells[2]}")
    for name in (ours, theirs):
        idle = Spread(x * 100 for x in results[f"{name} background"])
        note = f"{name}: {n_series[name]} series, background {idle.cell('{:.2f}')} % of a core"
        print(("\n" if args.markdown else "") + note if name == ours else note)


if __name__ == "__main__":
    main()

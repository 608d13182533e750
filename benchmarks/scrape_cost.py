"""CPU per scrape and per 1,000 series: trainprof's exporter next to Debian's
prometheus-node-exporter, in one run on the same machine.

    python benchmarks/scrape_cost.py [--idle 20] [--paced 60] [--burst 500]

trainprof runs with 8 fake H100s (the real NVML code against tests/fakes.py) and the real host
collectors; node_exporter with its defaults. Both are scraped the way Prometheus scrapes
(OpenMetrics accepted, gzip). For each exporter:

  background   CPU over --idle seconds with no scrapes (trainprof samples every 0.5 s)
  paced        --paced scrapes, one per 0.5 s: every trainprof scrape finds a new sample and
               renders it (the worst case: a 0.5 s scrape interval)
  burst        --burst scrapes back to back: trainprof serves most from the cached body

CPU per scrape = (process CPU during the scrapes - background rate x their duration) / scrapes,
from /proc/PID/stat (10 ms ticks, hence the many scrapes).
"""

from __future__ import annotations

import argparse
import time

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


def measure(name, proc, url, idle, paced, burst):
    wait_ready(url, proc)
    time.sleep(2)
    n_series = series(scrape(url))
    c0, t0 = cpu_seconds(proc.pid), time.monotonic()
    time.sleep(idle)
    background = (cpu_seconds(proc.pid) - c0) / (time.monotonic() - t0)
    rows = []
    for mode, count, pause in (("paced", paced, 0.5), ("burst", burst, 0.0)):
        c0, t0 = cpu_seconds(proc.pid), time.monotonic()
        for _ in range(count):
            scrape(url)
            if pause:
                time.sleep(pause)
        elapsed = time.monotonic() - t0
        per_scrape = (cpu_seconds(proc.pid) - c0 - background * elapsed) / count
        rows.append((name, mode, n_series, per_scrape, per_scrape / n_series * 1000, background))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=20)
    parser.add_argument("--paced", type=int, default=60)
    parser.add_argument("--burst", type=int, default=500)
    args = parser.parse_args()

    rows = []
    for name, start in (
        ("trainprof (8 fake GPUs)", start_trainprof),
        ("node_exporter", start_node_exporter),
    ):
        port = free_port()
        proc = start(port)
        try:
            rows += measure(
                name, proc, f"http://127.0.0.1:{port}/metrics", args.idle, args.paced, args.burst
            )
        finally:
            stop(proc)

    print("| exporter | scrapes | series | CPU ms/scrape | CPU ms/1,000 series | background CPU |")
    print("|---|---|---|---|---|---|")
    for name, mode, n, per_scrape, per_k, background in rows:
        print(
            f"| {name} | {mode} | {n} | {per_scrape * 1e3:.2f} | {per_k * 1e3:.2f} | "
            f"{background * 100:.2f} % of a core |"
        )
    ours = {mode: per_k for name, mode, _, _, per_k, _ in rows if name.startswith("trainprof")}
    theirs = {mode: per_k for name, mode, _, _, per_k, _ in rows if name == "node_exporter"}
    for mode in ours:
        print(
            f"{mode}: trainprof / node_exporter CPU per 1,000 series = "
            f"{ours[mode] / theirs[mode]:.2f}"
        )


if __name__ == "__main__":
    main()

"""The exporter's memory after 100 scrapes and after 10,000 (8 fake GPUs, host collectors).

    python benchmarks/rss.py [--scrapes 10000]

Scrapes back to back as Prometheus would (OpenMetrics, gzip), a new connection each, and
reads VmRSS from /proc/PID/status.
"""

from __future__ import annotations

import argparse

from _procs import free_port, rss_bytes, scrape, start_trainprof, stop, wait_ready


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=10_000)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = start_trainprof(port)
    try:
        wait_ready(url, proc)
        checkpoints = sorted({100, 1000, args.scrapes // 2, args.scrapes})
        done = 0
        for checkpoint in checkpoints:
            while done < checkpoint:
                scrape(url)
                done += 1
            print(f"RSS after {done:>6} scrapes: {rss_bytes(proc.pid) / 2**20:.1f} MiB")
    finally:
        stop(proc)


if __name__ == "__main__":
    main()

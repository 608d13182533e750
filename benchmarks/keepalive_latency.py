"""Scrape latency on one kept-alive connection, back to back and paced as Prometheus scrapes.

    python benchmarks/keepalive_latency.py [--scrapes 200] [--paced 20 --every 0.25]

Starts the exporter with 8 fake GPUs (benchmarks/fake_gpu_exporter.py) and a training rank
serving its /metrics (`trainprof.start`) and times each GET on one HTTP/1.1 connection that
stays open, as Prometheus keeps its connection to a target open, with the headers
Prometheus sends (OpenMetrics, gzip). A server that writes the headers and the body in two
`send()` calls without TCP_NODELAY makes every kept-alive scrape wait for the client's
delayed ACK (about 40 ms on Linux); one write does not. node_exporter, when installed, is
timed the same way for comparison.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import subprocess
import sys
import time

from _procs import (
    PROMETHEUS_HEADERS,
    free_port,
    start_node_exporter,
    start_trainprof,
    stop,
    wait_ready,
)

RANK = """
import sys, time
import trainprof
trainprof.start(port=int(sys.argv[1]), addr="127.0.0.1", training_job="latency")
for _ in range(100):
    with trainprof.step():
        with trainprof.phase("forward"):
            pass
time.sleep(3600)
"""


def timings(port: int, scrapes: int, every: float) -> list[float]:
    """Milliseconds per scrape on one kept-alive connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    out = []
    try:
        for _ in range(scrapes):
            started = time.perf_counter()
            conn.request("GET", "/metrics", headers=PROMETHEUS_HEADERS)
            response = conn.getresponse()
            response.read()
            out.append((time.perf_counter() - started) * 1000)
            if response.getheader("Connection", "").lower() == "close":
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            if every:
                time.sleep(every)
    finally:
        conn.close()
    return out


def report(name: str, port: int, args) -> None:
    timings(port, 5, 0)  # warm up: connection, first render
    for label, n, every in (("back to back", args.scrapes, 0), ("paced", args.paced, args.every)):
        ms = sorted(timings(port, n, every))
        p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
        print(
            f"{name:<14} {label:<13} {n:>4} scrapes: median {statistics.median(ms):7.2f} ms, "
            f"p99 {p99:7.2f} ms, max {ms[-1]:7.2f} ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=200, help="back-to-back scrapes")
    parser.add_argument("--paced", type=int, default=20, help="paced scrapes")
    parser.add_argument("--every", type=float, default=0.25, help="seconds between paced ones")
    args = parser.parse_args()

    port = free_port()
    proc = start_trainprof(port)
    try:
        wait_ready(f"http://127.0.0.1:{port}/metrics", proc)
        report("exporter", port, args)
    finally:
        stop(proc)

    port = free_port()
    rank = subprocess.Popen(
        [sys.executable, "-c", RANK, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}/metrics", rank)
        report("training rank", port, args)
    finally:
        stop(rank)

    if shutil.which("prometheus-node-exporter"):
        port = free_port()
        node = start_node_exporter(port)
        try:
            wait_ready(f"http://127.0.0.1:{port}/metrics", node)
            report("node_exporter", port, args)
        finally:
            stop(node)


if __name__ == "__main__":
    main()

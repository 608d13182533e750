"""Throughput and memory of `trainprof exporter` under 50 concurrent scrapers for a minute.

    python benchmarks/scrape_load.py [--scrapers 50] [--seconds 60] [--warm-up 15]

The same load as tests/test_exporter_load.py (which asserts only that every scrape
succeeds): half the scrapers ask as Prometheus does (OpenMetrics, gzip), half for plain
text, each on a new connection, back to back, beside a half-open client, a client dribbling
its headers and one that never reads. Prints scrapes per second, the least-served
scraper's count, and the exporter's RSS after the warm-up and at the end.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import threading
import time
import urllib.request

from _procs import PROMETHEUS_HEADERS, free_port, rss_bytes, stop, wait_ready


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapers", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--warm-up", type=float, default=15)
    args = parser.parse_args()

    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from trainprof.cli import main; "
         "sys.exit(main(sys.argv[1:]))", "exporter", "--web.listen-address",
         f"127.0.0.1:{port}", "--identity.node", "load", "--log.level", "error"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    slow: list[socket.socket] = []
    try:
        wait_ready(url, proc)
        silent = socket.create_connection(("127.0.0.1", port))
        never_reads = socket.create_connection(("127.0.0.1", port))
        never_reads.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        never_reads.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 20)
        dribbling = socket.create_connection(("127.0.0.1", port))
        slow += [silent, never_reads, dribbling]

        stop_event = threading.Event()
        counts = [0] * args.scrapers
        errors = [0]

        def scraper(i: int) -> None:
            headers = PROMETHEUS_HEADERS if i % 2 == 0 else {}
            while not stop_event.is_set():
                try:
                    request = urllib.request.Request(url, headers=headers)
                    with urllib.request.urlopen(request, timeout=30) as response:
                        response.read()
                    counts[i] += 1
                except Exception:  # noqa: BLE001 - counted
                    errors[0] += 1

        threads = [threading.Thread(target=scraper, args=(i,)) for i in range(args.scrapers)]
        start = time.monotonic()
        for t in threads:
            t.start()
        warm_rss = None
        warm_count = 0
        drip = iter(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" * 8)
        while time.monotonic() - start < args.seconds:
            if warm_rss is None and time.monotonic() - start > args.warm_up:
                warm_rss, warm_count = rss_bytes(proc.pid), sum(counts)
            try:
                dribbling.send(bytes([next(drip, 32)]))
            except OSError:
                pass
            time.sleep(1)
        stop_event.set()
        for t in threads:
            t.join(60)
        elapsed = time.monotonic() - start
        end_rss = rss_bytes(proc.pid)
    finally:
        for s in slow:
            s.close()
        stop(proc)
    total = sum(counts)
    print(
        f"{args.scrapers} scrapers, {elapsed:.0f} s: {total} scrapes ({total / elapsed:.0f}/s), "
        f"{errors[0]} failed, the least-served scraper got {min(counts)}"
    )
    if warm_rss is not None:
        print(
            f"RSS {warm_rss / 2**20:.1f} MiB after {args.warm_up:g} s ({warm_count} scrapes), "
            f"{end_rss / 2**20:.1f} MiB at the end ({(end_rss - warm_rss) / 2**20:+.1f} MiB)"
        )


if __name__ == "__main__":
    main()

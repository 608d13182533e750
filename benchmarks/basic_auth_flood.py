"""The exporter's CPU under a wrong-password flood, and what timing tells about user names.

    python benchmarks/basic_auth_flood.py [--clients 32] [--seconds 10] [--cost 10]

Starts `trainprof exporter` (no GPU) with a `--web.config.file` whose one user has a real
bcrypt hash of `--cost`, then:

1. scrapes once with the right password, as Prometheus did before any attack; times 5
   wrong passwords for the known user and 5 for an unknown one, alternating, on
   fresh connections: equal times mean timing does not tell which user names exist;
2. runs `--clients` threads sending wrong passwords as fast as answers come for `--seconds`
   from the same address, beside a "Prometheus" scraping once a second with the right
   password; reads the exporter's CPU seconds from /proc before and after and counts the
   answers by status (each 401 is one bcrypt check; a 429 is answered without one).
"""

from __future__ import annotations

import argparse
import base64
import collections
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import bcrypt
from _procs import cpu_seconds, free_port, status_of, stop


def get(url: str, user: str, password: str) -> int:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    return status_of(request, timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--cost", type=int, default=10)
    args = parser.parse_args()

    hashed = bcrypt.hashpw(b"right-password", bcrypt.gensalt(args.cost)).decode()
    with tempfile.TemporaryDirectory() as tmp:
        web = Path(tmp) / "web.yml"
        web.write_text(f"basic_auth_users:\n  prometheus: '{hashed}'\n")
        port = free_port()
        url = f"http://127.0.0.1:{port}/metrics"
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from trainprof.cli import main; "
             "sys.exit(main(sys.argv[1:]))", "exporter", "--no-collector.gpu",
             "--web.listen-address", f"127.0.0.1:{port}", "--web.config.file", str(web),
             "--log.level", "error"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(url, timeout=2)
                except urllib.error.HTTPError:
                    break  # 401: serving
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise
                    time.sleep(0.1)

            prometheus: collections.Counter = collections.Counter()
            prometheus[get(url, "prometheus", "right-password")] += 1  # before the attack
            known, unknown = [], []
            for _ in range(5):
                for user, out in (("prometheus", known), ("nobody", unknown)):
                    started = time.perf_counter()
                    get(url, user, "wrong")
                    out.append((time.perf_counter() - started) * 1000)
            print(
                f"wrong password, known user: median {statistics.median(known):6.1f} ms; "
                f"unknown user: {statistics.median(unknown):6.1f} ms"
            )

            statuses: collections.Counter = collections.Counter()
            lock = threading.Lock()
            stop_at = time.monotonic() + args.seconds

            def scrape_as_prometheus() -> None:
                while time.monotonic() < stop_at:
                    prometheus[get(url, "prometheus", "right-password")] += 1
                    time.sleep(1)

            def flood(i: int) -> None:
                while time.monotonic() < stop_at:
                    status = get(url, "prometheus", f"guess-{i}-{time.monotonic()}")
                    with lock:
                        statuses[status] += 1

            before = cpu_seconds(proc.pid)
            threads = [threading.Thread(target=flood, args=(i,)) for i in range(args.clients)]
            threads.append(threading.Thread(target=scrape_as_prometheus))
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            used = cpu_seconds(proc.pid) - before
            print(
                f"{args.clients} clients guessing for {args.seconds:g} s: exporter used "
                f"{used:.1f} CPU-seconds ({used / args.seconds:.0%} of one core); answers "
                + ", ".join(f"{n} x {s}" for s, n in sorted(statuses.items()))
            )
            print(
                "Prometheus with the right password, before and during the flood: "
                + ", ".join(f"{n} x {s}" for s, n in sorted(prometheus.items()))
            )
        finally:
            stop(proc)


if __name__ == "__main__":
    main()

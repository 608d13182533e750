"""Slow-loris clients against the exporter and the StopTraining receiver, with a real client
scraping or delivering beside them.

    python benchmarks/slowloris.py [--connections 128] [--seconds 20] [--drip 5]

Starts the exporter (8 fake GPUs) and `trainprof actions serve` (dry run) on 127.0.0.1, opens
`--connections` connections to each that send one byte of a request every `--drip` seconds
(reconnecting when closed, as an attacker would), and meanwhile scrapes the exporter and
posts an Alertmanager delivery to the receiver every 0.5 s. Prints how many of those real
requests succeeded and their latency.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from _procs import free_port, start_trainprof, status_of, stop, wait_ready

TOKEN = "slowloris-benchmark-token-0123"
FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "webhook-v4-starved.json"


def attack(port: int, n: int, drip: float, until: float, request: bytes) -> None:
    def one() -> None:
        while time.monotonic() < until:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=drip + 5) as s:
                    for byte in request:
                        if time.monotonic() >= until:
                            return
                        s.sendall(bytes([byte]))
                        time.sleep(drip)
            except OSError:
                time.sleep(0.05)

    for _ in range(n):
        threading.Thread(target=one, daemon=True).start()


def measure(name: str, call, until: float) -> None:
    ok, failed, ms = 0, [], []
    while time.monotonic() < until:
        started = time.perf_counter()
        try:
            status = call()
        except (OSError, urllib.error.URLError) as e:
            status = type(e).__name__
        ms.append((time.perf_counter() - started) * 1000)
        if status == 200:
            ok += 1
        else:
            failed.append(status)
        time.sleep(0.5)
    kinds = {str(k): failed.count(k) for k in set(failed)}
    print(
        f"{name}: {ok} of {ok + len(failed)} succeeded (failures: {kinds or 'none'}); "
        f"median {statistics.median(ms):.1f} ms, max {max(ms):.1f} ms"
    )


def scrape(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as r:
        r.read()
        return r.status


def deliver(url: str, body: bytes) -> int:
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {TOKEN}")
    return status_of(request, timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--drip", type=float, default=5)
    args = parser.parse_args()

    exporter_port, actions_port = free_port(), free_port()
    exporter = start_trainprof(exporter_port)
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "actions.yaml"
        config.write_text(
            json.dumps(
                {
                    "listen": f"127.0.0.1:{actions_port}",
                    "token_env": "BENCH_TOKEN",
                    "audit_log": str(Path(tmp) / "audit.jsonl"),
                    "allow": {"namespaces": ["team-a"], "training_jobs": ["starved"]},
                    "rules": {"CPUBottleneck": "stop"},
                    "local": {"jobs": {"starved": {"pid_file": "/nonexistent.pid"}}},
                }
            )
        )
        receiver = subprocess.Popen(
            [sys.executable, "-c", "import sys; from trainprof.cli import main; "
             "sys.exit(main(sys.argv[1:]))", "actions", "serve", "-c", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "BENCH_TOKEN": TOKEN},
        )  # fmt: skip
        try:
            metrics = f"http://127.0.0.1:{exporter_port}/metrics"
            wait_ready(metrics, exporter)
            alerts = f"http://127.0.0.1:{actions_port}/alerts"
            deadline = time.monotonic() + 30
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{actions_port}/-/healthy", timeout=2)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            body = FIXTURE.read_bytes()
            until = time.monotonic() + args.seconds
            attack(exporter_port, args.connections, args.drip, until, b"GET /metrics HTTP/1.1\r\n")
            attack(actions_port, args.connections, args.drip, until, b"POST /alerts HTTP/1.1\r\n")
            time.sleep(1)
            print(
                f"{args.connections} slow-loris connections to each, one byte every "
                f"{args.drip:g} s, for {args.seconds:g} s:"
            )
            threads = [
                threading.Thread(
                    target=measure, args=("exporter scrapes", lambda: scrape(metrics), until)
                ),
                threading.Thread(
                    target=measure,
                    args=("receiver deliveries", lambda: deliver(alerts, body), until),
                ),
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            stop(exporter)
            stop(receiver)


if __name__ == "__main__":
    main()

"""Load: the real `trainprof exporter` process, 50 concurrent scrapers for 20 s, with a
half-open client, a client dribbling its headers and a client that never reads its answer
connected the whole time. Every scrape must succeed, every scraper keep getting answers,
and nothing may reach the log but a line or two. How many scrapes a second and how the
memory grows are figures, measured by benchmarks/scrape_load.py, not asserted here."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from servers import free_port

SCRAPERS = 50
SECONDS = 20
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
    "Accept-Encoding": "gzip",
}


def scrape(url: str, prometheus_like: bool) -> None:
    request = urllib.request.Request(url, headers=PROMETHEUS_HEADERS if prometheus_like else {})
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
        if prometheus_like:
            assert response.headers["Content-Encoding"] == "gzip"
            assert gzip.decompress(body).endswith(b"# EOF\n")
        else:
            assert b"trainprof_samples_total" in body


@pytest.mark.slow(reason="a load test: 50 scrapers against a real exporter for 20 s")
def test_50_scrapers_for_a_minute_with_slow_clients(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    log = open(tmp_path / "exporter.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainprof.cli",
            "exporter",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--identity.node",
            "load",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    slow: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                scrape(url, True)
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "exporter.log").read_text()
                assert time.monotonic() < deadline, "the exporter never answered"
                time.sleep(0.1)

        silent = socket.create_connection(("127.0.0.1", port))
        never_reads = socket.create_connection(("127.0.0.1", port))
        never_reads.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        never_reads.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 20)
        dribbling = socket.create_connection(("127.0.0.1", port))
        slow += [silent, never_reads, dribbling]

        stop = threading.Event()
        counts = [0] * SCRAPERS
        errors: list[str] = []

        def scraper(i: int) -> None:
            while not stop.is_set():
                try:
                    scrape(url, prometheus_like=i % 2 == 0)
                    counts[i] += 1
                except Exception as e:  # noqa: BLE001 - every failure is collected
                    errors.append(f"scraper {i}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=scraper, args=(i,)) for i in range(SCRAPERS)]
        for t in threads:
            t.start()
        start = time.monotonic()
        for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\n" * 4:
            if time.monotonic() - start > SECONDS:
                break
            try:
                dribbling.send(bytes([byte]))
            except OSError:
                pass  # the exporter may drop it after its timeout; that is its right
            time.sleep(1)
        stop.set()
        for t in threads:
            t.join(60)
    finally:
        for s in slow:
            s.close()
        proc.terminate()
        proc.wait(30)
        log.close()

    assert not errors, errors[:5]
    assert proc.returncode == 0
    assert min(counts) >= 1, f"a scraper was starved: {sorted(counts)[:5]}"
    assert "Traceback" not in (tmp_path / "exporter.log").read_text()
    assert os.path.getsize(tmp_path / "exporter.log") < 10_000, "the log is flooded"

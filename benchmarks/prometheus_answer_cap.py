"""What the report's Prometheus client holds in memory for the largest answers a server can
send: a flood it refuses at the 32 MiB cap, and an answer just under the cap that it reads.

    .venv/bin/python benchmarks/prometheus_answer_cap.py [--repeat 3]

Each variant runs in a fresh Python process against a loopback
server: "flood" streams 1 GiB of chunked body, "near the cap" serves a 31 MiB matrix
answer (about 7,000 series of 200 points) that is decoded and checked as the report reads
it. Rounds are interleaved; medians with min and max of seconds and peak RSS (a client that
fails is timed from outside, its RSS the largest of the children so far: run it with
--repeat 1 and the flood first to see the old client's). Not a test: timings depend on the
machine.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CLIENT = """
import resource, sys, time
from trainprof.engines.prometheus_api import PrometheusAPI, PrometheusAPIError
started = time.perf_counter()
try:
    series = PrometheusAPI(sys.argv[1]).range("x", 0, 3000, 15)
    outcome = f"read {len(series)} series"
except PrometheusAPIError as e:
    outcome = str(e).splitlines()[0]
print(time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, outcome)
"""


def _near_cap() -> bytes:
    values = [[15 * k, "0.123456789"] for k in range(1, 201)]
    result = [
        {"metric": {"__name__": "x", "gpu": str(i), "training_job": "bert"}, "values": values}
        for i in range(7_000)
    ]
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})


def serve(near_cap: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            try:
                if self.path.startswith("/flood"):
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    block = b"[" * 2**20
                    for _ in range(1024):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
                else:
                    self.send_header("Content-Length", str(len(near_cap)))
                    self.end_headers()
                    self.wfile.write(near_cap)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _client(url: str) -> tuple[float, float, str]:
    """Seconds, peak RSS in MiB and what the client said (its last line if it failed)."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT, url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = proc.communicate()
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    if proc.returncode:
        return seconds, peak, "failed: " + (err.strip().splitlines() or ["?"])[-1][:100]
    return float(out.split()[0]), float(out.split()[1]) / 1024, out.split(maxsplit=2)[2].strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    near_cap = _near_cap().encode()
    server = serve(near_cap)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    variants = {"flood (1 GiB offered)": f"{base}/flood", "near the cap": f"{base}/near"}
    seen: dict[str, list[tuple[float, float, str]]] = {name: [] for name in variants}
    for _ in range(args.repeat):
        for name, url in variants.items():
            seen[name].append(_client(url))
    print(f"near-the-cap body: {len(near_cap) / 2**20:.1f} MiB")
    for name, runs in seen.items():
        seconds = [s for s, _, _ in runs]
        rss = [r for _, r, _ in runs]
        print(
            f"{name:<22} {statistics.median(seconds):6.2f} s (min {min(seconds):.2f}, max "
            f"{max(seconds):.2f})  peak RSS {statistics.median(rss):6.0f} MiB (min "
            f"{min(rss):.0f}, max {max(rss):.0f})  {runs[0][2]}"
        )
    server.shutdown()


if __name__ == "__main__":
    main()

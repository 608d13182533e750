"""Helpers shared by the benchmarks: start a server, read its CPU time and RSS, scrape it."""

from __future__ import annotations

import gzip
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMETHEUS_HEADERS = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/"
    "openmetrics-text;version=0.0.1;q=0.75,text/plain;"
    "version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}
TICKS = os.sysconf("SC_CLK_TCK")


def status_of(request: urllib.request.Request | str, timeout: float) -> int:
    """The HTTP status of one request, read to the end; an error status is returned too."""
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.close()
        return e.code


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def scrape(url: str) -> bytes:
    request = urllib.request.Request(url, headers=PROMETHEUS_HEADERS)
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return body


def series(body: bytes) -> int:
    return sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))


def wait_ready(url: str, proc: subprocess.Popen, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            scrape(url)
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} never answered") from None
            time.sleep(0.1)


def node_exporter() -> str:
    """Debian's prometheus-node-exporter, installed with apt if missing (root only)."""
    path = shutil.which("prometheus-node-exporter")
    if path:
        return path
    if os.geteuid() != 0:
        sys.exit(
            "prometheus-node-exporter is missing: sudo apt-get install "
            "--no-install-recommends prometheus-node-exporter"
        )
    policy = Path("/usr/sbin/policy-rc.d")
    made = not policy.exists()
    if made:  # without systemd, the postinst would otherwise start it on :9100
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(
            [
                "apt-get",
                "install",
                "-y",
                "-qq",
                "--no-install-recommends",
                "prometheus-node-exporter",
            ],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
    finally:
        if made:
            policy.unlink()
    return shutil.which("prometheus-node-exporter")


def start_trainprof(port: int, gpus: int = 8) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            str(HERE / "fake_gpu_exporter.py"),
            "--port",
            str(port),
            "--gpus",
            str(gpus),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def start_node_exporter(port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [node_exporter(), f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def serve_exposition(body: Callable[[], bytes | None]) -> http.server.ThreadingHTTPServer:
    """Serve `body()` as a Prometheus text exposition on a free loopback port, in a thread;
    a None body answers 503 (a target that stopped serving)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            data = body()
            if data is None:
                self.send_error(503)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def serve_paths(bodies: dict[str, Callable[[], bytes | None]]) -> http.server.ThreadingHTTPServer:
    """`serve_exposition` with one body per path (404 for another path)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = bodies.get(self.path)
            data = body() if body is not None else None
            if data is None:
                self.send_error(404 if body is None else 503)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server

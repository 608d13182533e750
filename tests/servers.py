"""Real servers for tests: Prometheus and Alertmanager (from trainprof.engines.localstack), webhook
sinks, the actions receiver and a fake Kubernetes API, on 127.0.0.1 and free ports."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

from trainprof.engines.localstack import alertmanager, free_port, prometheus

__all__ = ["alertmanager", "free_port", "get_json", "prometheus", "query"]


def get_json(url: str, timeout: float = 5.0) -> dict:
    """The JSON at `url`; an error status raises urllib's HTTPError. The tests read
    Prometheus' API with this, not with trainprof's client (engines/prometheus_api.py), so
    that what the report and the demo read is checked against an answer read apart."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def query(base: str, expr: str) -> dict:
    """Prometheus' whole answer to the instant query `expr`."""
    return get_json(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")


@contextlib.contextmanager
def _loopback(handler, daemon_threads: bool = False):
    """Serve `handler` on a free 127.0.0.1 port in a thread; yields the base URL.
    `daemon_threads`: closing does not wait for requests still being answered (a handler
    that stalls on purpose)."""
    import threading
    from http.server import ThreadingHTTPServer

    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = daemon_threads
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Delivery:
    """One request a `webhook_sink` received."""

    def __init__(self, path: str, headers: dict[str, str], body: bytes, at: float):
        self.path, self.headers, self.body, self.at = path, headers, body, at

    def json(self) -> dict:
        return json.loads(self.body)


@contextlib.contextmanager
def webhook_sink():
    """A loopback HTTP server that answers 200 to every POST and keeps what it received.

    Yields (base_url, deliveries); `deliveries` is a list appended to as requests arrive.
    """
    import threading
    from http.server import BaseHTTPRequestHandler

    deliveries: list[Delivery] = []
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                deliveries.append(Delivery(self.path, dict(self.headers), body, time.monotonic()))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    with _loopback(Handler) as url:
        yield url, deliveries


def wait_for(condition, timeout: float, what: str, step: float = 0.2):
    """Poll `condition` until it returns something truthy; fail naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(step)


@contextlib.contextmanager
def actions_receiver(config, token: str, audit_path: Path, stop=None, client=None):
    """`trainprof actions` in a thread on a free loopback port; yields (url, receiver).

    `stop` replaces the real stopper (a spy records what would have been stopped); with
    `client` the Kubernetes target talks to that client's API server.
    """
    import dataclasses
    import threading

    from trainprof.actions import audit, decide
    from trainprof.actions.server import ActionsHTTPServer, Receiver

    config = dataclasses.replace(config, listen=("127.0.0.1", 0))
    log = audit.AuditLog(str(audit_path))
    actions = decide.Actions(config, stop or decide.stopper(config, client))
    actions.remember(audit.history(str(audit_path)))
    receiver = Receiver(config, token, actions, log)
    server = ActionsHTTPServer(config.listen, receiver)
    # A short poll interval: shutdown() waits for the next poll.
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", receiver
    finally:
        server.shutdown()
        server.server_close()
        log.close()


@contextlib.contextmanager
def fake_kubernetes(responses: dict[tuple[str, str], int] | None = None):
    """A loopback stand-in for the Kubernetes API server that records every call.

    Yields (url, calls); each call is a dict with method, path, content_type, authorization
    and body (parsed JSON). `responses` maps (method, path) to a status (default 200).
    """
    from http.server import BaseHTTPRequestHandler

    calls: list[dict] = []
    responses = responses or {}

    class Handler(BaseHTTPRequestHandler):
        def _record(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            calls.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "content_type": self.headers.get("Content-Type"),
                    "authorization": self.headers.get("Authorization"),
                    "body": json.loads(raw) if raw else None,
                }
            )
            status = responses.get((self.command, self.path), 200)
            body = json.dumps(
                {"kind": "Status", "code": status, "message": f"fake answer {status}"}
            ).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _record

        def log_message(self, *args):
            pass

    with _loopback(Handler) as url:
        yield url, calls


def wait_for_targets(base: str, count: int, timeout: float = 30.0) -> None:
    """Until `count` scrape targets are up (the first scrape comes ~5 s after start)."""
    deadline = time.monotonic() + timeout
    while True:
        targets = get_json(f"{base}/api/v1/targets")["data"]["activeTargets"]
        if sum(t["health"] == "up" for t in targets) >= count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"targets not up after {timeout:g}s: {targets}")
        time.sleep(0.2)


def try_query(base: str, expr: str) -> tuple[list | None, str | None]:
    """(result, None) or (None, Prometheus' error message) for an instant query."""
    import urllib.error

    try:
        doc = query(base, expr)
    except urllib.error.HTTPError as e:
        body = json.loads(e.read() or b"{}")
        return None, body.get("error", str(e))
    return doc["data"]["result"], None


def wait_for_firing(base: str, rules: set[str], timeout: float = 60.0) -> set[str]:
    """Until alerts of every rule in `rules` fire; the rules firing then."""
    deadline = time.monotonic() + timeout
    while True:
        alerts = get_json(f"{base}/api/v1/alerts")["data"]["alerts"]
        firing = {a["labels"].get("rule") for a in alerts if a["state"] == "firing"}
        if rules <= firing:
            return firing
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"after {timeout:g}s only {sorted(firing)} fire, not all of {sorted(rules)}"
            )
        time.sleep(0.5)

"""The HTTP side of the StopTraining receiver: Alertmanager POSTs its webhook here.

    POST /alerts     Authorization: Bearer <token>, Content-Type: application/json
    GET  /-/healthy  200 "ok" (no authentication; for probes)

Checks run cheapest and most general first, and nothing is read or parsed for a client that
has not proven it holds the token:

    404 other path, 405 other method, 503 too many requests in flight (connections
        beyond 64 are closed without an answer)
    429 over the rate limit (per client address, with Retry-After)
    401 no or wrong bearer token (constant-time comparison)
    415 not application/json, 411 no Content-Length, 413 body over max_body_bytes,
        408 body not received within the 10 s read timeout
    400 not UTF-8 JSON
    422 not an Alertmanager v4 payload, or a label value that cannot name a job (the whole
        request is refused)
    502 a stop failed (Alertmanager retries; what was done is not done again)
    200 everything else: each alert's decision is in the response and the audit log
"""

from __future__ import annotations

import hmac
import json
import math
import socket
import ssl
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from trainprof.actions import decide
from trainprof.actions.audit import AuditLog
from trainprof.actions.config import ActionsConfig
from trainprof.actions.payload import PayloadError, parse

PATH = "/alerts"
MAX_IN_FLIGHT = 16  # webhook requests being processed
MAX_CONNECTIONS = 64  # open connections, each a thread; more are closed at once


class RateLimiter:
    """A token bucket per client address: `burst` requests at once, refilled at
    `per_minute`. Addresses beyond `max_clients` evict the longest idle one."""

    def __init__(self, per_minute: int, burst: int, clock=time.monotonic, max_clients: int = 4096):
        self.rate, self.burst, self.clock = per_minute / 60.0, float(burst), clock
        self.max_clients = max_clients
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, at)
        self._lock = threading.Lock()

    def wait(self, client: str) -> float:
        """0 if the request may proceed (and counts it), else seconds until it may."""
        with self._lock:
            now = self.clock()
            tokens, at = self._buckets.pop(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if len(self._buckets) >= self.max_clients:
                del self._buckets[next(iter(self._buckets))]
            if tokens >= 1:
                self._buckets[client] = (tokens - 1, now)
                return 0.0
            self._buckets[client] = (tokens, now)
            return (1 - tokens) / self.rate


class Receiver:
    """Request handling, independent of the socket server that calls it."""

    def __init__(self, config: ActionsConfig, token: str, actions: decide.Actions, audit: AuditLog):
        self.config, self.actions, self.audit = config, actions, audit
        self._token = token.encode()
        self.limiter = RateLimiter(config.limits.requests_per_minute, config.limits.burst)
        self._slots = threading.BoundedSemaphore(MAX_IN_FLIGHT)

    def post(self, h: BaseHTTPRequestHandler) -> None:
        request_id = uuid.uuid4().hex[:16]
        remote = h.client_address[0] if h.client_address else ""

        def reply(
            status: int,
            reason: str,
            body: dict[str, Any] | None = None,
            headers: dict[str, str] | None = None,
        ) -> None:
            self.audit.write(
                "request",
                request_id=request_id,
                remote=remote,
                method="POST",
                path=h.path[:200],
                status=status,
                reason=reason,
            )
            _send(h, status, {"request_id": request_id, **(body or {"error": reason})}, headers)

        if h.path != PATH:
            return reply(404, f"no such path; POST alerts to {PATH}")
        if not self._slots.acquire(blocking=False):
            return reply(503, "too many requests in flight", headers={"Retry-After": "1"})
        try:
            self._post(h, reply, request_id, remote)
        finally:
            self._slots.release()

    def _post(self, h, reply, request_id: str, remote: str) -> None:
        wait = self.limiter.wait(remote)
        if wait:
            return reply(
                429, "rate limit exceeded", headers={"Retry-After": str(max(1, math.ceil(wait)))}
            )
        scheme, _, given = h.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode("utf-8", "replace"), self._token
        ):
            return reply(
                401,
                "missing or wrong bearer token",
                headers={"WWW-Authenticate": 'Bearer realm="trainprof-actions"'},
            )
        content_type = h.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if content_type != "application/json":
            return reply(415, "expected Content-Type: application/json")
        length_header = h.headers.get("Content-Length")
        if h.headers.get("Transfer-Encoding") or length_header is None:
            return reply(411, "a Content-Length is required")
        try:
            length = int(length_header)
            if length < 0:
                raise ValueError
        except ValueError:
            return reply(400, "Content-Length is not a number")
        if length > self.config.limits.max_body_bytes:
            h.close_connection = True
            return reply(413, f"body of {length} bytes exceeds {self.config.limits.max_body_bytes}")
        try:
            body = h.rfile.read(length)
        except TimeoutError:
            h.close_connection = True
            return reply(408, "body not received in time")
        if len(body) != length:
            return reply(400, "body shorter than its Content-Length")
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return reply(400, "body is not UTF-8 JSON")
        try:
            alerts = parse(data)
        except PayloadError as e:
            return reply(422, f"not an Alertmanager webhook payload: {e}")

        plans = [decide.plan(self.config, a) for a in alerts]
        refused = [p for p in plans if p.decision == "refused"]
        if refused:
            for p in plans:
                why = (
                    p.reason if p.decision == "refused" else "request refused: " + refused[0].reason
                )
                self._audit_decision(request_id, decide.Decision(p.alert, "refused", why))
            return reply(422, refused[0].reason)
        decisions = self.actions.handle(plans)
        for d in decisions:
            self._audit_decision(request_id, d)
        failed = [d for d in decisions if d.decision == "failed"]
        status = 502 if failed else 200
        reply(
            status,
            failed[0].reason if failed else "ok",
            {
                "decisions": [
                    {
                        "fingerprint": d.alert.fingerprint,
                        "rule": d.alert.labels.get("rule", ""),
                        "decision": d.decision,
                        "reason": d.reason,
                        "target": d.target,
                    }
                    for d in decisions
                ]
            },
        )

    def _audit_decision(self, request_id: str, d: decide.Decision) -> None:
        labels = d.alert.labels
        self.audit.write(
            "decision",
            request_id=request_id,
            decision=d.decision,
            reason=d.reason,
            rule=labels.get("rule", ""),
            alertname=labels.get("alertname", ""),
            namespace=labels.get("namespace", ""),
            training_job=labels.get("training_job", ""),
            target=d.target,
            fingerprint=d.alert.fingerprint,
            starts_at=d.alert.starts_at,
            dry_run=self.config.dry_run,
        )


def _send(
    h: BaseHTTPRequestHandler,
    status: int,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> None:
    data = (json.dumps(body) + "\n").encode()
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(data)))
    for name, value in (headers or {}).items():
        h.send_header(name, value)
    h.end_headers()
    h.wfile.write(data)


class _Handler(BaseHTTPRequestHandler):
    server_version = "trainprof-actions"
    sys_version = ""
    timeout = 10  # seconds a client may take per read: no slow-loris threads
    server: ActionsHTTPServer

    def do_POST(self):
        self.server.receiver.post(self)

    def do_GET(self):
        if self.path == "/-/healthy":
            _send(self, 200, {"status": "ok"})
        else:
            self._refuse()

    def _refuse(self):
        status = 405 if self.path == PATH else 404
        self.server.receiver.audit.write(
            "request",
            remote=self.client_address[0],
            method=self.command,
            path=self.path[:200],
            status=status,
            reason="method or path",
        )
        _send(
            self,
            status,
            {"error": "POST webhook payloads to " + PATH},
            {"Allow": "POST"} if status == 405 else None,
        )

    do_PUT = do_DELETE = do_PATCH = _refuse

    def log_message(self, format, *args):  # the audit log records every request
        pass


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context for PEM files; raises OSError or ssl.SSLError."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    return context


class ActionsHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # the listen backlog; connections over the cap are closed

    def __init__(
        self, address: tuple[str, int], receiver: Receiver, context: ssl.SSLContext | None = None
    ):
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self.receiver = receiver
        self._connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        if context:
            # The handshake then happens in the handler's thread, under its timeout, not
            # in accept(), where one silent client would block every other.
            self.socket = context.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )

    def handle_error(self, request, client_address):
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            return  # the client went away; its request is in the audit log
        print(f"trainprof actions: error serving {client_address[0]}: {error!r}", file=sys.stderr)

    def process_request(self, request, client_address):
        if not self._connections.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._connections.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._connections.release()

"""The HTTP side of the StopTraining receiver: Alertmanager POSTs its webhook here.

    POST /alerts     Authorization: Bearer <token>, Content-Type: application/json
    GET  /-/healthy  200 "ok" (no authentication; for probes)

Checks run cheapest and most general first, and nothing is read or parsed for a client that
has not proven it holds the token:

    429 over the rate limit (per client address, with Retry-After), checked before anything
        is written to the audit log: a flood adds one line per client and burst, not one
        per request
    404 other path, 405 other method, 503 too many requests in flight
    401 no or wrong bearer token (constant-time comparison)
    400 two Content-Length headers
    415 not application/json, 411 no Content-Length, 413 body over max_body_bytes,
        408 body not received within the 10 s read timeout
    400 not UTF-8 JSON
    422 not an Alertmanager v4 payload, or every alert has a label value that cannot name
        a job (one such alert is refused alone; the others are handled)
    502 a stop failed (Alertmanager retries; what was done is not done again)
    200 everything else: each alert's decision is in the response and the audit log

Connections are served by `trainprof.contract.httpserve` (64 at most; a client that has not sent its
request headers within 5 s, or holds a slot that a new client needs while it sends nothing,
is closed, so slow-loris clients cannot block Alertmanager's deliveries). The audit log
records a path without its query string: a token pasted there never reaches the log.
"""

from __future__ import annotations

import hmac
import json
import math
import ssl
import threading
import uuid
from typing import Any
from urllib.parse import urlsplit

from trainprof.actions import decide
from trainprof.actions.audit import AuditLog
from trainprof.actions.config import ActionsConfig
from trainprof.actions.payload import PayloadError, parse
from trainprof.contract import httpserve
from trainprof.contract.httpserve import RateLimiter
from trainprof.contract.names import JOB_LABEL

__all__ = ["ActionsHTTPServer", "RateLimiter", "Receiver", "tls_context"]

PATH = "/alerts"
MAX_IN_FLIGHT = 16  # webhook requests being processed
MAX_CONNECTIONS = 64  # open connections, each a thread
HEADER_TIMEOUT = 5.0  # seconds a client has to send its request line and headers
TIMEOUT = 10.0  # seconds a client may take per read or write once its request started


class Receiver:
    """Request handling, independent of the socket server that calls it."""

    def __init__(self, config: ActionsConfig, token: str, actions: decide.Actions, audit: AuditLog):
        self.config, self.actions, self.audit = config, actions, audit
        self._token = token.encode()
        self.limiter = RateLimiter(config.limits.requests_per_minute, config.limits.burst)
        self._slots = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        self._limited: dict[str, int] = {}  # client -> refusals not written to the audit log
        self._limited_lock = threading.Lock()

    def admit(self, h: httpserve.Handler) -> bool:
        """Apply the rate limit before anything is audited; False when answered 429.

        The first refusal of a burst is audited, later ones are counted and their number
        audited once the client is admitted again.
        """
        remote = h.client_address[0] if h.client_address else ""
        wait = self.limiter.wait(remote)
        with self._limited_lock:
            if wait:
                first = remote not in self._limited
                if first and len(self._limited) >= 4096:
                    self._limited.pop(next(iter(self._limited)))
                self._limited[remote] = self._limited.get(remote, -1) + 1
            else:
                suppressed = self._limited.pop(remote, 0)
        if not wait:
            if suppressed:
                self.audit.write("rate_limited", remote=remote, refused_unlogged=suppressed)
            return True
        reason = "rate limit exceeded"
        if first:
            self.audit.write(
                "request",
                remote=remote,
                method=h.command,
                path=shown_path(h.path),
                status=429,
                reason=reason + "; further refusals of this burst are counted, not logged",
            )
        retry = str(max(1, math.ceil(wait)))
        _send(h, 429, {"error": reason}, {"Retry-After": retry})
        return False

    def post(self, h: httpserve.Handler) -> None:
        request_id = uuid.uuid4().hex[:16]
        remote = h.client_address[0] if h.client_address else ""
        if not self.admit(h):
            return

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
                path=shown_path(h.path),
                status=status,
                reason=reason,
            )
            _send(h, status, {"request_id": request_id, **(body or {"error": reason})}, headers)

        if urlsplit(h.path).path != PATH:
            return reply(404, f"no such path; POST alerts to {PATH}")
        if not self._slots.acquire(blocking=False):
            return reply(503, "too many requests in flight", headers={"Retry-After": "1"})
        try:
            self._post(h, reply, request_id, remote)
        finally:
            self._slots.release()

    def _post(self, h, reply, request_id: str, remote: str) -> None:
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
        if refused and len(refused) == len(plans):
            for p in plans:
                self._audit_decision(request_id, decide.Decision(p.alert, "refused", p.reason))
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
            training_job=labels.get(JOB_LABEL, ""),
            target=d.target,
            fingerprint=d.alert.fingerprint,
            starts_at=d.alert.starts_at,
            dry_run=self.config.dry_run,
        )


def shown_path(path: str) -> str:
    """The path as the audit log shows it: no query string (it may carry a token).

    >>> shown_path("/alerts?token=s3cret")
    '/alerts?(query not logged)'
    """
    parts = urlsplit(path)
    shown = parts.path[:200]
    return shown + "?(query not logged)" if parts.query else shown


def _send(
    h: httpserve.Handler,
    status: int,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> None:
    data = (json.dumps(body) + "\n").encode()
    h.respond(status, data, "application/json", headers)


class _Handler(httpserve.Handler):
    server_version = "trainprof-actions"
    server: ActionsHTTPServer

    def do_POST(self):
        self.server.receiver.post(self)

    def do_GET(self):
        if urlsplit(self.path).path == "/-/healthy":
            _send(self, 200, {"status": "ok"})
        else:
            self._refuse()

    def _refuse(self):
        receiver = self.server.receiver
        if not receiver.admit(self):
            return
        status = 405 if urlsplit(self.path).path == PATH else 404
        receiver.audit.write(
            "request",
            remote=self.client_address[0],
            method=self.command,
            path=shown_path(self.path),
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


def tls_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A server context for PEM files; raises OSError, ssl.SSLError or
    httpserve.EncryptedKey (a key with a passphrase)."""
    return httpserve.tls_server_context(cert_file, key_file)


class ActionsHTTPServer(httpserve.Server):
    """The receiver on `address`, with TLS when `context` is given. Raises OSError."""

    def __init__(
        self, address: tuple[str, int], receiver: Receiver, context: ssl.SSLContext | None = None
    ):
        limits = httpserve.Limits(
            max_connections=MAX_CONNECTIONS, header_timeout=HEADER_TIMEOUT, timeout=TIMEOUT
        )
        sock = httpserve.listen(*address)
        try:
            super().__init__(sock, _Handler, name="actions", limits=limits, ssl_context=context)
        except BaseException:
            sock.close()
            raise
        self.receiver = receiver

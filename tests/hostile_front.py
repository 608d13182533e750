"""Small HTTP fronts on 127.0.0.1 that misbehave before a real server (a Prometheus, a
dcgm-exporter body): they redirect elsewhere, echo the credentials, mangle an answer, trickle
or flood. Each yields its base URL and what it saw."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from servers import _loopback


class Seen(list):
    """(path, Authorization header) of every request a front received."""


def _handler(respond: Callable[[BaseHTTPRequestHandler], None], seen: Seen):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append((self.path, self.headers.get("Authorization")))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                respond(self)

        def log_message(self, *args):
            pass

    return Handler


@contextlib.contextmanager
def front(respond: Callable[[BaseHTTPRequestHandler], None]):
    """A server answering every GET with `respond(request)`; yields (base URL, seen)."""
    seen = Seen()
    with _loopback(_handler(respond, seen), daemon_threads=True) as base:
        yield base, seen


def answer(request: BaseHTTPRequestHandler, status: int, body: bytes, **headers: str) -> None:
    request.send_response(status)
    request.send_header("Content-Length", str(len(body)))
    request.send_header("Connection", "close")
    for name, value in headers.items():
        request.send_header(name.replace("_", "-"), value)
    request.end_headers()
    request.wfile.write(body)


def forward(upstream: str, request: BaseHTTPRequestHandler) -> tuple[int, bytes]:
    """`upstream`'s status and body for the request's path (an error status included)."""
    try:
        with urllib.request.urlopen(upstream + request.path, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def forwarding(upstream: str, change: Callable[[str, Any], Any] | None = None):
    """A `respond` that passes every GET to `upstream`; `change(path, answer)` may return
    another JSON document (or bytes) in place of Prometheus' answer, or None to pass it."""

    def respond(request: BaseHTTPRequestHandler) -> None:
        status, body = forward(upstream, request)
        changed = change(request.path, json.loads(body)) if change else None
        if changed is not None:
            body = changed if isinstance(changed, bytes) else json.dumps(changed).encode()
        answer(request, status, body, Content_Type="application/json")

    return respond


def redirecting(target: str, status: int = 302):
    """A `respond` that redirects every GET to the same path at `target`."""

    def respond(request: BaseHTTPRequestHandler) -> None:
        answer(request, status, b"", Location=target + request.path)

    return respond


def trickling(head: bytes, every: float, body: bool = True):
    """A `respond` that sends its status line and headers (or, with body=False, the start
    of them) and then one byte every `every` seconds, for ever."""

    def respond(request: BaseHTTPRequestHandler) -> None:
        request.wfile.write(head)
        request.wfile.flush()
        while True:
            time.sleep(every)
            request.wfile.write(b" " if body else b"X")
            request.wfile.flush()

    return respond


def flooding(sent: list[int], chunk: int = 1 << 20, declare: bool = False):
    """A `respond` that streams zero bytes without end (chunked, or with a Content-Length of
    1 GiB when `declare`), adding each chunk's size to sent[0]."""

    def respond(request: BaseHTTPRequestHandler) -> None:
        request.send_response(200)
        request.send_header("Content-Type", "application/json")
        if declare:
            request.send_header("Content-Length", str(2**30))
        else:
            request.send_header("Transfer-Encoding", "chunked")
        request.end_headers()
        block = b"[" * chunk
        framed = block if declare else b"%x\r\n%s\r\n" % (len(block), block)
        while sent[0] < 2**30:
            request.wfile.write(framed)
            sent[0] += len(block)

    return respond

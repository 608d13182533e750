"""The one HTTP GET trainprof sends to a server it does not control: the Prometheus HTTP API
client (`trainprof report --prometheus`, the demo) and the exporter's dcgm-exporter fetcher.

    body = get("http://127.0.0.1:9400/metrics", {"Authorization": "Basic ..."},
               timeout=2.0, max_bytes=8 * 2**20, proxies=False)

What it guards against, for every user of it:

- **Credentials sent to another server.** urllib copies every header of a request, the
  Authorization header and a tenant's X-Scope-OrgID included, to wherever a redirect points.
  A redirect is followed only to the same origin (scheme, host and port); one to another
  server is refused with a `FetchError` naming that server, and nothing is sent to it.
- **A body without end.** At most `max_bytes` are read (a larger Content-Length is refused
  before any of it is read).
- **A server that trickles.** The whole exchange (connect, TLS handshake, headers, body) has
  `timeout` seconds: when they are up, the connection is shut down under whatever read
  waits on it, so a byte every few seconds cannot hold the caller.
- **Secrets in messages.** A `FetchError`'s sentence never holds a header's value (what
  `secrets` finds in the headers sent), whatever the server echoed: `redact` removes them.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import http.client
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

ERROR_BODY_BYTES = 64 * 1024  # a server's explanation of an error status; never more is read
_CHUNK = 1024 * 1024
# Shorter values are left in messages: searching for them would garble every sentence and
# guard nothing a guess would not find.
_SHORTEST_SECRET = 4


class FetchError(Exception):
    """A GET that failed, as one sentence free of secrets. `status` is the HTTP error
    status (None for no answer), `body` the start of that answer (for a client that reads
    the server's explanation), `kind` one of: unreachable, status, redirect, too_large,
    too_slow."""

    def __init__(self, message: str, kind: str, status: int | None = None, body: bytes = b""):
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.body = body


def secrets(headers: Mapping[str, str]) -> list[str]:
    """What must never appear in a message: every header value sent, and the credential
    inside an Authorization header (the token, the base64 pair, the user:password and the
    password alone).

    >>> secrets({"Authorization": "Basic dXNlcjpwYXNzLXNlY3JldA=="})
    ['Basic dXNlcjpwYXNzLXNlY3JldA==', 'dXNlcjpwYXNzLXNlY3JldA==', 'user:pass-secret', \
'pass-secret']
    """
    found: list[str] = []
    for name, value in headers.items():
        found.append(value)
        if name.lower() != "authorization":
            continue
        scheme, _, credential = value.partition(" ")
        found.append(credential.strip())
        if scheme.lower() == "basic":
            with contextlib.suppress(binascii.Error, UnicodeDecodeError):
                pair = base64.b64decode(credential.strip(), validate=True).decode()
                found += [pair, pair.partition(":")[2]]
    return [s for s in dict.fromkeys(found) if len(s) >= _SHORTEST_SECRET]


def redact(text: str, hidden: Iterable[str]) -> str:
    """`text` with each of `hidden` (longest first) replaced by ***.

    >>> redact("bad header Bearer s3cret-token", secrets({"Authorization": "Bearer s3cret-token"}))
    'bad header ***'
    """
    for secret in sorted(hidden, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def origin(url: str) -> str:
    """scheme://host:port of `url`, without user, path or query: what a message may name.

    >>> origin("https://user:pw@Prometheus.example.com/api/v1/query?query=up")
    'https://prometheus.example.com:443'
    """
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    port = port or {"http": 80, "https": 443}.get(parts.scheme.lower())
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme.lower()}://{host}:{port}"


def get(
    url: str,
    headers: Mapping[str, str],
    timeout: float,
    max_bytes: int,
    context: ssl.SSLContext | None = None,
    proxies: bool = True,
) -> bytes:
    """The body of GET `url`, sent with `headers`; FetchError otherwise. `proxies`: honour
    the environment's HTTP(S)_PROXY (off for a server on the same node)."""
    hidden = secrets(headers)
    deadline = _Deadline(timeout)
    handlers: list[Any] = [
        _SameOrigin(),
        _HTTPHandler(deadline),
        _HTTPSHandler(deadline, context),
    ]
    if not proxies:
        handlers.append(urllib.request.ProxyHandler({}))
    opener = urllib.request.build_opener(*handlers)
    request = urllib.request.Request(url, headers=dict(headers))
    try:
        with opener.open(request, timeout=timeout) as response:
            return _read(response, max_bytes, deadline, timeout, hidden)
    except urllib.error.HTTPError as e:
        if deadline.expired:
            raise _too_slow(timeout) from None
        body = _error_body(e)
        reason = redact(str(e.reason), hidden)
        raise FetchError(f"HTTP {e.code} {reason}", "status", e.code, body) from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
        # A read that timed out (a connect that did is a URLError: unreachable).
        if deadline.expired or isinstance(e, TimeoutError):
            raise _too_slow(timeout) from None
        reason = str(getattr(e, "reason", None) or e) or type(e).__name__
        raise FetchError(redact(reason, hidden), "unreachable") from None
    finally:
        deadline.cancel()


def _too_slow(timeout: float) -> FetchError:
    return FetchError(f"no complete answer within {timeout:g}s", "too_slow")


def _read(response: Any, max_bytes: int, deadline: _Deadline, timeout: float, hidden) -> bytes:
    length = response.headers.get("Content-Length")
    if length is not None and length.strip().isdigit() and int(length) > max_bytes:
        raise _too_large(max_bytes, f" (Content-Length {int(length)})")
    chunks, size = [], 0
    read = getattr(response, "read1", response.read)
    while chunk := read(_CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes, "")
        chunks.append(chunk)
    if deadline.expired:
        raise _too_slow(timeout)
    return b"".join(chunks)


def _too_large(max_bytes: int, detail: str) -> FetchError:
    return FetchError(f"the answer is larger than {_size(max_bytes)}{detail}", "too_large")


def _size(n: int) -> str:
    """A size in words.

    >>> _size(8 * 2**20), _size(1536)
    ('8 MiB', '1.5 KiB')
    """
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} bytes"


def _error_body(e: urllib.error.HTTPError) -> bytes:
    try:
        return e.read(ERROR_BODY_BYTES)
    except (OSError, http.client.HTTPException):
        return b""


# --- the deadline ----------------------------------------------------------------------------


class _Deadline:
    """Shuts down every connection of one GET when its time is up. A socket timeout bounds
    each read, not their sum; shutting the socket down ends whichever read is waiting."""

    def __init__(self, seconds: float):
        self.at = time.monotonic() + seconds
        self.expired = False
        self._timers: list[tuple[threading.Timer, socket.socket]] = []
        self._lock = threading.Lock()

    def watch(self, sock: socket.socket) -> socket.socket:
        # A duplicate of the descriptor: TLS detaches the socket it wraps, and shutdown()
        # acts on the connection whichever descriptor names it.
        watched = sock.dup()
        timer = threading.Timer(max(self.at - time.monotonic(), 0.0), self._cut, (watched,))
        timer.daemon = True
        with self._lock:
            self._timers.append((timer, watched))
        timer.start()
        return sock

    def _cut(self, sock: socket.socket) -> None:
        self.expired = True
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        with self._lock:
            timers, self._timers = self._timers, []
        for timer, sock in timers:
            timer.cancel()
            sock.close()


class _Watched:
    """An http.client connection whose socket the deadline watches from its creation."""

    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any):
        super().__init__(*args, **kwargs)
        create = self._create_connection  # type: ignore[has-type]
        self._create_connection = lambda *a, **k: deadline.watch(create(*a, **k))


class _HTTPConnection(_Watched, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Watched, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline):
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_HTTPConnection, deadline=self._deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline, context: ssl.SSLContext | None):
        super().__init__(context=context)
        self._deadline = deadline
        self._tls = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = functools.partial(_HTTPSConnection, deadline=self._deadline)
        return self.do_open(connection, req, context=self._tls)


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """Follows a redirect to the same scheme, host and port; refuses any other."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        target = urllib.parse.urljoin(req.full_url, newurl)
        if origin(target) != origin(req.full_url):
            fp.close()
            raise FetchError(
                f"redirected (HTTP {code}) to another server, {origin(target)}: not "
                "followed, so the credentials and headers meant for "
                f"{origin(req.full_url)} are not sent there; give that server's URL if it "
                "is the one to read",
                "redirect",
                code,
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)

"""The one HTTP/1.1 server under every port trainprof opens: the exporter's `/metrics`, the
StopTraining receiver and each training rank's `/metrics`.

    sock = listen(*parse_listen_address(":9945"))
    server = Server(sock, MyHandler, name="exporter", limits=Limits(max_connections=64))
    server.start()          # serves in a daemon thread; or server.serve_forever()
    ...
    server.stop()

What it guards against, for every user of it:

- **A connection cap** (`max_connections`, one thread each). When the cap is reached, a new
  connection first takes the slot of the longest-waiting connection that has not sent a
  request (a slow-loris client, a half-open socket, an idle keep-alive; not one whose request
  has arrived unread, nor one that sent its request line less than STARTED_GRACE ago), and
  only when every slot is busy serving a request is it refused with 503 (or, with
  `refuse_when_busy=False`, left in the listen backlog until a slot frees).
- **A header deadline** (`header_timeout`, default 5 s): a client has that long, counted from
  the connection, to finish its TLS handshake, request line and headers; then its
  connection is closed. Dripping one byte every few seconds no longer holds a slot. A later
  request on a kept-alive connection must be complete within `idle_timeout` of the previous
  answer (the connection stays evictable meanwhile), and every read or write while a
  request is served times out after `timeout`.
- **Deferred TLS handshakes**: in the connection's thread, under the header deadline, never
  in the accept loop.
- **One write per response**: status line, headers and body go out in one `send()` with
  `TCP_NODELAY`, so a kept-alive client is not made to wait for Nagle's algorithm and a
  delayed ACK (44 ms a scrape before this, 0.1 ms after; see benchmarks/README.md).
- **Request smuggling**: two `Content-Length` headers are refused with 400.

Logging goes to `logging.getLogger("trainprof.<name>")`, never to stdout.
"""

from __future__ import annotations

import dataclasses
import http.server
import logging
import select
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable

from trainprof._version import __version__


def parse_listen_address(
    text: str, *, default_port: int, allow_any_host: bool = True
) -> tuple[str, int]:
    """`:9945`, `127.0.0.1:9945`, `[::1]:9945`, `localhost:0` -> (host, port).

    An empty host means every interface (refused when `allow_any_host` is False, for a
    receiver that must name the interface it exposes). Raises ValueError naming the problem:

    >>> parse_listen_address("[::1]:9095", default_port=9095)
    ('::1', 9095)
    >>> parse_listen_address("9095", default_port=9095)
    Traceback (most recent call last):
    ...
    ValueError: '9095' is not HOST:PORT (e.g. :9095 or 127.0.0.1:9095)
    """
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:{default_port})")
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ValueError(
            f"{text!r} is not HOST:PORT (e.g. :{default_port} or 127.0.0.1:{default_port})"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 host in brackets, e.g. [::1]:{default_port}")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"{text!r}: port {port_text!r} is not a number from 0 to 65535")
    if not host and not allow_any_host:
        raise ValueError(
            f"{text!r}: name the interface, e.g. 127.0.0.1:{port_text} or 0.0.0.0:{port_text}"
        )
    if any(c.isspace() for c in host) or "/" in host:
        raise ValueError(f"{text!r}: {host!r} is not a host name or address")
    return host, int(port_text)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket; raises OSError (e.g. EADDRINUSE) as the OS reports it.

    An empty host listens on every interface, IPv6 and IPv4 where the OS allows both.
    """
    if not host:
        if socket.has_dualstack_ipv6():
            return socket.create_server(
                ("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=128
            )
        return socket.create_server(("0.0.0.0", port), backlog=128)
    # A name such as localhost may resolve to ::1 first; prefer IPv4, as Go exporters do, so
    # a Prometheus configured with 127.0.0.1 finds it.
    families = [info[0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]
    family = socket.AF_INET if socket.AF_INET in families else families[0]
    return socket.create_server((host, port), family=family, backlog=128)


class EncryptedKey(ValueError):
    """A TLS private key protected by a passphrase, which a server cannot type."""


def tls_server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """A TLS 1.2+ server context for PEM files.

    Raises OSError or ssl.SSLError for files that cannot be read, and EncryptedKey for a key
    with a passphrase (OpenSSL would otherwise prompt for it on the terminal and hang a
    service).
    """

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file, password=refuse_passphrase(key_file))
    return context


def refuse_passphrase(key_file: str) -> Callable[[], bytes]:
    """The `password` callback of `load_cert_chain` that refuses instead of prompting."""

    def refuse() -> bytes:
        raise EncryptedKey(
            f"{key_file} is encrypted (it has a passphrase), which a server cannot type; "
            f"decrypt it, e.g. openssl pkey -in {key_file} -out plain.key"
        )

    return refuse


@dataclasses.dataclass(frozen=True)
class Limits:
    """How much a client may take: see the module doc."""

    max_connections: int = 64
    header_timeout: float = 5.0
    idle_timeout: float = 60.0
    timeout: float = 30.0
    # When every slot serves a request: answer a new connection 503 at once (True), or leave
    # it in the kernel's listen backlog until a slot frees (False: costs the process nothing,
    # for a server inside a training loop).
    refuse_when_busy: bool = True


# A connection waits for a request, has sent its request line and is sending headers
# (started), or is being served (busy).
_WAITING, _STARTED, _BUSY = "waiting", "started", "busy"
# Seconds a client that has sent its request line is safe from eviction: enough for a real
# client's headers to follow (microseconds), too short to shelter a slow-loris client.
STARTED_GRACE = 0.25


@dataclasses.dataclass
class _Connection:
    sock: socket.socket
    state: str
    deadline: float  # for a waiting connection: when its headers must be complete
    since: float


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """Serves `handler` (a `Handler` subclass) on a socket that is already listening."""

    daemon_threads = True
    block_on_close = False

    def __init__(
        self,
        sock: socket.socket,
        handler: type[Handler],
        *,
        name: str,
        limits: Limits = Limits(),
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__(sock.getsockname()[:2], handler, bind_and_activate=False)
        self.socket.close()  # TCPServer made one of its own; serve the given one instead
        self.socket = sock
        self.server_name, self.server_port = sock.getsockname()[:2]
        self.name = name
        self.log = logging.getLogger(f"trainprof.{name}")
        self.limits = limits
        self.ssl_context = ssl_context
        self._clock = clock
        self._connections: dict[int, _Connection] = {}
        self._lock = threading.Lock()
        self._slot_freed = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._full_since: float | None = None
        self.evicted = 0  # connections closed to make room (tests and the log)
        self.refused = 0

    # --- running -------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.socket.getsockname()[:2]
        return host, port

    @property
    def url(self) -> str:
        host, port = self.address
        if host in ("0.0.0.0", "::"):
            host = socket.gethostname()
        elif ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.ssl_context else 'http'}://{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": 0.25},
            name=f"trainprof-{self.name}-http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
        self.server_close()
        with self._lock:
            connections = list(self._connections.values())
        for connection in connections:
            _close(connection.sock)

    def close_socket(self) -> None:
        """Close the listening socket without touching the serving thread (a forked child)."""
        try:
            self.socket.close()
        except OSError:
            pass

    def serve_forever(self, poll_interval: float = 0.25) -> None:
        # The poll interval is also how often service_actions closes overdue connections.
        super().serve_forever(min(poll_interval, 0.25))

    # --- connections ---------------------------------------------------------------------

    def _handle_request_noblock(self) -> None:
        if not self.limits.refuse_when_busy:
            with self._slot_freed:
                if not self._room():
                    self._slot_freed.wait(0.25)
                    if not self._room():
                        return  # the connection waits in the backlog; serve_forever polls
        super()._handle_request_noblock()  # type: ignore[misc]

    def _room(self) -> bool:
        """A slot is free or held by a connection without a request (lock held)."""
        return len(self._connections) < self.limits.max_connections or bool(self._evictable())

    def _evictable(self) -> list[_Connection]:
        """Connections waiting for a request with nothing unread: a request that has
        arrived but not yet been read by its thread is not evicted (lock held)."""
        now = self._clock()
        slow = [
            c
            for c in self._connections.values()
            if c.state == _STARTED and now - c.since > STARTED_GRACE
        ]
        waiting = [c for c in self._connections.values() if c.state == _WAITING]
        if not waiting:
            return slow
        poller = select.poll()  # not select(): descriptors above 1024 are fine
        by_fd = {}
        for c in waiting:
            try:
                fd = c.sock.fileno()
            except (OSError, ValueError):
                continue
            if fd >= 0:
                by_fd[fd] = c
                poller.register(fd, select.POLLIN)
        unread = {fd for fd, _ in poller.poll(0)}
        return slow + [c for fd, c in by_fd.items() if fd not in unread]

    def get_request(self):
        conn, address = self.socket.accept()
        if self.ssl_context is not None:
            conn = self.ssl_context.wrap_socket(
                conn, server_side=True, do_handshake_on_connect=False
            )
        return conn, address

    def process_request(self, request, client_address):
        now = self._clock()
        with self._lock:
            room = len(self._connections) < self.limits.max_connections or self._evict_one()
            if not room and not self.limits.refuse_when_busy:
                # Accepted in a race with a slot filling up: wait for one, as the backlog would.
                give_up = now + self.limits.timeout
                while not room and self._clock() < give_up:
                    self._slot_freed.wait(0.25)
                    room = len(self._connections) < self.limits.max_connections or self._evict_one()
                now = self._clock()
            if room:
                self._connections[id(request)] = _Connection(
                    request, _WAITING, now + self.limits.header_timeout, now
                )
        if not room:
            self.refused += 1
            if self._full_since is None:
                self._full_since = now
                self.log.warning(
                    "%d connections are busy serving requests, the configured maximum; "
                    "refusing new ones with 503 until some finish",
                    self.limits.max_connections,
                )
            _refuse(request)
            return
        if self._full_since is not None:
            self._full_since = None
            self.log.info("connections are below the maximum again")
        try:
            super().process_request(request, client_address)
        except Exception:
            self._forget(request)
            raise

    def _evict_one(self) -> bool:
        """Close the longest-waiting connection that has no request in progress (lock held)."""
        waiting = self._evictable()
        if not waiting:
            return False
        oldest = min(waiting, key=lambda c: c.since)
        del self._connections[id(oldest.sock)]
        self.evicted += 1
        self.log.debug("closed a connection waiting for a request to make room for a new one")
        _close(oldest.sock)
        return True

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request) -> None:
        with self._lock:
            self._connections.pop(id(request), None)
            self._slot_freed.notify()

    def service_actions(self) -> None:
        """Close connections past their header deadline (called by serve_forever)."""
        now = self._clock()
        with self._lock:
            overdue = [
                c
                for c in self._connections.values()
                if c.state in (_WAITING, _STARTED) and c.deadline <= now
            ]
            for c in overdue:
                del self._connections[id(c.sock)]
            if overdue:
                self._slot_freed.notify()
        for c in overdue:
            self.log.debug("closed a connection that sent no complete request in time")
            _close(c.sock)

    def mark(self, request, state: str, deadline: float | None = None) -> None:
        """A connection's handler says it waits for a request or is serving one."""
        now = self._clock()
        with self._lock:
            connection = self._connections.get(id(request))
            if connection is not None:
                connection.state = state
                connection.since = now
                connection.deadline = now + (
                    self.limits.header_timeout if deadline is None else deadline
                )
                if state == _WAITING:
                    self._slot_freed.notify()

    def started(self, request) -> None:
        """A waiting connection's request line has arrived: its headers must follow within
        the header deadline, and it is safe from eviction for STARTED_GRACE."""
        now = self._clock()
        with self._lock:
            connection = self._connections.get(id(request))
            if connection is not None and connection.state == _WAITING:
                connection.state = _STARTED
                connection.since = now
                connection.deadline = min(connection.deadline, now + self.limits.header_timeout)

    def handle_error(self, request, client_address):
        # A client that times out, resets or fails its handshake is that client's problem.
        self.log.debug("connection from %s ended with an error", client_address, exc_info=True)


def _close(sock: socket.socket) -> None:
    """Wake a thread blocked reading `sock` and close it (works for TLS sockets too)."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


def _refuse(request: socket.socket) -> None:
    try:
        if not isinstance(request, ssl.SSLSocket):
            request.setblocking(False)
            request.send(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                b"Content-Length: 21\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
                b"too many connections\n"
            )
    except OSError:
        pass
    finally:
        request.close()


class _Announcing:
    """A reader that calls `on_line` whenever `readline` returns a line."""

    def __init__(self, raw, on_line: Callable[[], None]):
        self._raw, self._on_line = raw, on_line

    def readline(self, size: int = -1) -> bytes:
        line = self._raw.readline(size)
        if line:
            self._on_line()
        return line

    def __getattr__(self, name: str):
        return getattr(self._raw, name)


class Handler(http.server.BaseHTTPRequestHandler):
    """Base of every trainprof handler: deadlines, single-write responses, logging."""

    protocol_version = "HTTP/1.1"
    server_version = f"trainprof/{__version__}"
    sys_version = ""
    server: Server
    _headers_buffer: list[bytes]

    def setup(self) -> None:
        limits = self.server.limits
        self.request.settimeout(min(limits.timeout, limits.header_timeout))
        try:
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()
        super().setup()
        self.rfile = _Announcing(self.rfile, lambda: self.server.started(self.request))  # type: ignore[assignment]

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection:
            self._await_next_request()
            self.handle_one_request()

    def _await_next_request(self) -> None:
        """Between keep-alive requests the connection waits, evictable, for `idle_timeout`."""
        server = self.server
        server.mark(self.request, _WAITING, deadline=server.limits.idle_timeout)
        self.request.settimeout(server.limits.idle_timeout)

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        self.server.mark(self.request, _BUSY, deadline=self.server.limits.timeout)
        self.request.settimeout(self.server.limits.timeout)
        if len(self.headers.get_all("Content-Length") or ()) > 1:
            self.send_error(400, "more than one Content-Length header")
            return False
        return True

    def respond(
        self,
        status: int,
        body: bytes,
        content_type: str,
        headers: dict[str, str] | None = None,
        send_body: bool = True,
    ) -> None:
        """The whole response in one write (see the module doc on Nagle's algorithm)."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self._headers_buffer.append(b"\r\n")
        if send_body:
            self._headers_buffer.append(body)
        self.flush_headers()

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        self.server.log.debug("%s %s", self.address_string(), format % args)


class ReadHandler(Handler):
    """A handler that only serves reads: GET, and HEAD the same without the body."""

    def do_GET(self) -> None:
        self.serve(send_body=True)

    def do_HEAD(self) -> None:
        self.serve(send_body=False)

    def serve(self, send_body: bool) -> None:
        raise NotImplementedError


class RateLimiter:
    """A token bucket per client address: `burst` at once, refilled at `per_minute`.
    Addresses beyond `max_clients` evict the longest idle one."""

    def __init__(
        self,
        per_minute: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        max_clients: int = 4096,
    ):
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

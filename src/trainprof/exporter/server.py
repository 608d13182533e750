"""The HTTP side: `/metrics` from cached bodies, a landing page, TLS and basic auth.

One thread per connection (HTTP/1.1 keep-alive, as Prometheus scrapes), so a slow or
half-open client holds only its own thread; every socket operation times out after
`timeout` seconds, TLS handshakes run in the connection's thread rather than the accept loop,
and past `max_connections` new connections are refused with 503 instead of queueing.
"""

from __future__ import annotations

import base64
import binascii
import html
import http.server
import logging
import socket
import socketserver
import ssl
import threading
from typing import ClassVar
from urllib.parse import urlsplit

from trainprof._version import __version__
from trainprof.exporter.exposition import (
    OPENMETRICS,
    TEXT,
    ScrapeBodies,
    wants_gzip,
    wants_openmetrics,
)
from trainprof.exporter.once import Once
from trainprof.exporter.webconfig import WebConfig

log = logging.getLogger("trainprof.exporter")

DEFAULT_PORT = 9945


def parse_listen_address(text: str) -> tuple[str, int]:
    """`:9945`, `127.0.0.1:9945`, `[::1]:9945`, `localhost:0` -> (host, port).

    An empty host means every interface. Raises ValueError naming the problem.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ValueError(
            f"{text!r} is not HOST:PORT (e.g. :{DEFAULT_PORT} or 127.0.0.1:{DEFAULT_PORT})"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 host in brackets, e.g. [::1]:{DEFAULT_PORT}")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"{text!r}: port {port_text!r} is not a number from 0 to 65535")
    return host, int(port_text)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket; raises OSError (e.g. EADDRINUSE) as the OS reports it."""
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


class MetricsServer:
    """Serves `bodies` on a socket that is already listening."""

    def __init__(
        self,
        sock: socket.socket,
        bodies: ScrapeBodies,
        web: WebConfig | None = None,
        telemetry_path: str = "/metrics",
        max_connections: int = 64,
        timeout: float = 30.0,
    ):
        handler = type(
            "Handler",
            (_Handler,),
            {
                "bodies": bodies,
                "web": web or WebConfig(),
                "telemetry_path": telemetry_path,
                "timeout": timeout,
            },
        )
        self._server = _Server(sock, handler, max_connections, web.ssl_context if web else None)
        self._thread: threading.Thread | None = None
        self.tls = bool(web and web.ssl_context)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.socket.getsockname()[:2]
        return host, port

    @property
    def url(self) -> str:
        host, port = self.address
        if host in ("0.0.0.0", "::"):
            host = socket.gethostname()
        elif ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.tls else 'http'}://{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.5},
            name="trainprof-http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def close_socket(self) -> None:
        """Close the listening socket without touching the serving thread (a forked child)."""
        try:
            self._server.socket.close()
        except OSError:
            pass


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(
        self, sock: socket.socket, handler, max_connections: int, ssl_context: ssl.SSLContext | None
    ):
        super().__init__(sock.getsockname()[:2], handler, bind_and_activate=False)
        self.socket.close()  # TCPServer made one of its own; serve the given one instead
        self.socket = sock
        self.server_name, self.server_port = sock.getsockname()[:2]
        self._ssl_context = ssl_context
        self._slots = threading.BoundedSemaphore(max_connections)
        self._max_connections = max_connections
        self._once = Once(log)

    def get_request(self):
        conn, address = self.socket.accept()
        if self._ssl_context is not None:
            # The handshake happens in the connection's own thread (see _Handler.setup), so
            # a client that connects and never speaks TLS cannot stall the accept loop.
            conn = self._ssl_context.wrap_socket(
                conn, server_side=True, do_handshake_on_connect=False
            )
        return conn, address

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self._once.start(
                "connections",
                "%d connections are open, the configured "
                "maximum; refusing new ones until some close",
                self._max_connections,
            )
            _refuse(request)
            return
        self._once.end("connections", "connections are below the maximum again")
        try:
            super().process_request(request, client_address)
        except Exception:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address):
        # A client that times out, resets or fails its handshake is that client's problem.
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


def _refuse(request: socket.socket) -> None:
    try:
        if not isinstance(request, ssl.SSLSocket):
            request.setblocking(False)
            request.send(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                b"Content-Length: 21\r\nConnection: close\r\n\r\n"
                b"too many connections\n"
            )
    except OSError:
        pass
    finally:
        request.close()


_LANDING = """<!DOCTYPE html>
<html><head><title>trainprof exporter</title></head>
<body><h1>trainprof exporter</h1>
<p>Host and GPU samples every datapoint interval, for trainprof's profiler rules.</p>
<p><a href="{path}">Metrics</a></p>
<p>version {version}</p></body></html>
"""


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"trainprof-exporter/{__version__}"
    sys_version = ""
    bodies: ScrapeBodies
    web: WebConfig
    telemetry_path: str
    timeout: ClassVar[float]

    def setup(self) -> None:
        self.request.settimeout(self.timeout)
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()
        super().setup()

    def do_GET(self) -> None:
        self._respond(send_body=True)

    def do_HEAD(self) -> None:
        self._respond(send_body=False)

    def _respond(self, send_body: bool) -> None:
        if self.web.users and not self._authorized():
            self._send(
                401,
                b"Unauthorized\n",
                "text/plain; charset=utf-8",
                send_body,
                {"WWW-Authenticate": 'Basic realm="trainprof exporter"'},
            )
            return
        path = urlsplit(self.path).path
        if path == self.telemetry_path:
            openmetrics = wants_openmetrics(self.headers.get("Accept"))
            compressed = wants_gzip(self.headers.get("Accept-Encoding"))
            try:
                body = self.bodies.body(openmetrics, compressed)
            except Exception:  # noqa: BLE001 - a rendering bug must not kill the connection
                log.exception("rendering the scrape failed")
                self._send(
                    500,
                    b"rendering the metrics failed; see the exporter's log\n",
                    "text/plain; charset=utf-8",
                    send_body,
                )
                return
            extra = {"Content-Encoding": "gzip"} if compressed else {}
            self._send(200, body, OPENMETRICS if openmetrics else TEXT, send_body, extra)
        elif path == "/":
            page = _LANDING.format(path=html.escape(self.telemetry_path), version=__version__)
            self._send(200, page.encode(), "text/html; charset=utf-8", send_body)
        else:
            self._send(404, b"Not Found\n", "text/plain; charset=utf-8", send_body)

    def _authorized(self) -> bool:
        scheme, _, encoded = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        return bool(sep) and self.web.authorized(user, password)

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        send_body: bool,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in {**self.web.headers, **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        log.debug("%s %s", self.address_string(), format % args)

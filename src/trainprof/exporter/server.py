"""The HTTP side: `/metrics` from cached bodies, a landing page, TLS and basic auth.

Served by `trainprof.contract.httpserve` (one thread per connection, HTTP/1.1 keep-alive as
Prometheus scrapes, a connection cap that evicts clients that never send a request, a header
deadline, deferred TLS handshakes, one write per response).
"""

from __future__ import annotations

import base64
import binascii
import html
import socket
from urllib.parse import urlsplit

from trainprof._version import __version__
from trainprof.contract import httpserve
from trainprof.exporter.exposition import (
    OPENMETRICS,
    TEXT,
    ScrapeBodies,
    wants_gzip,
    wants_openmetrics,
)
from trainprof.exporter.webconfig import WebConfig

DEFAULT_PORT = 9945


def parse_listen_address(text: str) -> tuple[str, int]:
    """`--web.listen-address`: see `trainprof.contract.httpserve.parse_listen_address`."""
    return httpserve.parse_listen_address(text, default_port=DEFAULT_PORT)


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
        header_timeout: float = 5.0,
    ):
        handler = type(
            "Handler",
            (_Handler,),
            {"bodies": bodies, "web": web or WebConfig(), "telemetry_path": telemetry_path},
        )
        limits = httpserve.Limits(
            max_connections=max_connections, header_timeout=header_timeout, timeout=timeout
        )
        self._server = httpserve.Server(
            sock,
            handler,
            name="exporter",
            limits=limits,
            ssl_context=web.ssl_context if web else None,
        )
        self.tls = bool(web and web.ssl_context)

    @property
    def address(self) -> tuple[str, int]:
        return self._server.address

    @property
    def url(self) -> str:
        return self._server.url

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()

    def close_socket(self) -> None:
        """Close the listening socket without touching the serving thread (a forked child)."""
        self._server.close_socket()


_LANDING = """<!DOCTYPE html>
<html><head><title>trainprof exporter</title></head>
<body><h1>trainprof exporter</h1>
<p>Host and GPU samples every datapoint interval, for trainprof's profiler rules.</p>
<p><a href="{path}">Metrics</a></p>
<p>version {version}</p></body></html>
"""


class _Handler(httpserve.ReadHandler):
    server_version = f"trainprof-exporter/{__version__}"
    bodies: ScrapeBodies
    web: WebConfig
    telemetry_path: str

    def serve(self, send_body: bool) -> None:
        if self.web.users:
            verdict = self._authorized()
            if verdict is not True:
                headers = {"WWW-Authenticate": 'Basic realm="trainprof exporter"'}
                if verdict is None:  # too many failures from this client
                    self._send(
                        429,
                        b"Too many failed logins; retry later\n",
                        "text/plain; charset=utf-8",
                        send_body,
                        {"Retry-After": "10"},
                    )
                    return
                self._send(401, b"Unauthorized\n", "text/plain; charset=utf-8", send_body, headers)
                return
        path = urlsplit(self.path).path
        if path == self.telemetry_path:
            openmetrics = wants_openmetrics(self.headers.get("Accept"))
            compressed = wants_gzip(self.headers.get("Accept-Encoding"))
            try:
                body = self.bodies.body(openmetrics, compressed)
            except Exception:  # noqa: BLE001 - a rendering bug must not kill the connection
                self.server.log.exception("rendering the scrape failed")
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

    def _authorized(self) -> bool | None:
        """True, False, or None when this client failed too often (see WebConfig)."""
        scheme, _, encoded = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        return self.web.authorized(user, password, client=self.client_address[0])

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        send_body: bool,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.respond(status, body, content_type, {**self.web.headers, **(headers or {})}, send_body)

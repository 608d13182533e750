"""The `/metrics` server inside a training process, on `trainprof.contract.httpserve`.

The training loop shares its process (and the GIL) with this server, so it is capped harder
than the exporter: at most `MAX_CONNECTIONS` connections (one thread each; a client that has
not sent its request headers within `HEADER_TIMEOUT` is closed, one that sends nothing gives
its slot to a new client, and when all are busy serving, new ones wait in the listen
backlog rather than cost the process an answer), every read or write times out after
`TIMEOUT`, and renders are spaced at least `MIN_RENDER_INTERVAL` apart: a scrape that comes
sooner after the last render waits for the next one, and every scrape waiting meanwhile
shares it (and its gzipped bytes). A storm of
scrapers therefore costs the loop at most one render per `MIN_RENDER_INTERVAL` (20 a
second), never a stale body; a Prometheus scraping every few seconds never waits.

Every path serves the metrics (as prometheus_client's server did), in the text format or
OpenMetrics as the `Accept` header asks, gzipped when `Accept-Encoding` allows.
"""

from __future__ import annotations

import gzip
import threading
import time

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

from trainprof.contract import httpserve
from trainprof.exporter.exposition import wants_gzip

MAX_CONNECTIONS = 16
HEADER_TIMEOUT = 5.0
TIMEOUT = 10.0
MIN_RENDER_INTERVAL = 0.05


class _Flight:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.body = b""
        self.gzipped: bytes | None = None
        self.error: BaseException | None = None
        self.lock = threading.Lock()

    def compressed(self) -> bytes:
        with self.lock:
            if self.gzipped is None:
                self.gzipped = gzip.compress(self.body, compresslevel=1)
            return self.gzipped


class _Bodies:
    """Renders per content type; concurrent requests share the render in progress."""

    def __init__(self, registry: CollectorRegistry):
        self._registry = registry
        self._flights: dict[str, _Flight] = {}
        self._lock = threading.Lock()
        self._rendered = -MIN_RENDER_INTERVAL  # monotonic time of the last render

    def body(self, accept: str | None) -> tuple[_Flight, str]:
        encoder, content_type = choose_encoder(accept or "")
        with self._lock:
            flight = self._flights.get(content_type)
            mine = flight is None
            if mine:
                flight = self._flights[content_type] = _Flight()
        assert flight is not None
        if mine:
            try:
                wait = self._rendered + MIN_RENDER_INTERVAL - time.monotonic()
                if wait > 0:
                    time.sleep(wait)  # others asking meanwhile join this flight
                flight.body = encoder(self._registry)
                self._rendered = time.monotonic()
            except BaseException as e:
                flight.error = e
            finally:
                with self._lock:
                    del self._flights[content_type]
                flight.done.set()
        else:
            flight.done.wait(TIMEOUT)
        if flight.error is not None or not flight.done.is_set():
            raise RuntimeError("rendering the metrics failed") from flight.error
        return flight, content_type


class _Handler(httpserve.ReadHandler):
    bodies: _Bodies

    def serve(self, send_body: bool) -> None:
        if self.path.startswith("/favicon.ico"):
            self.respond(404, b"Not Found\n", "text/plain; charset=utf-8", send_body=send_body)
            return
        flight, content_type = self.bodies.body(self.headers.get("Accept"))
        body, headers = flight.body, {}
        if wants_gzip(self.headers.get("Accept-Encoding")):
            body = flight.compressed()  # once per render, shared by its scrapes
            headers["Content-Encoding"] = "gzip"
        self.respond(200, body, content_type, headers, send_body)


def serve(registry: CollectorRegistry, addr: str, port: int) -> httpserve.Server:
    """Listen on addr:port and serve `registry` from a daemon thread; raises OSError."""
    sock = httpserve.listen(addr, port)
    try:
        handler = type("RankHandler", (_Handler,), {"bodies": _Bodies(registry)})
        limits = httpserve.Limits(
            max_connections=MAX_CONNECTIONS,
            header_timeout=HEADER_TIMEOUT,
            timeout=TIMEOUT,
            refuse_when_busy=False,
        )
        server = httpserve.Server(sock, handler, name="rank", limits=limits)
    except BaseException:
        sock.close()
        raise
    server.start()
    return server

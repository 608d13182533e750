"""Prometheus' HTTP API (/api/v1), the one client trainprof reads a Prometheus with (or
Mimir, Thanos, Cortex, VictoriaMetrics, vmalert): the report, the demo and the benchmarks.

    api = PrometheusAPI("http://127.0.0.1:9090", access=Access({"X-Scope-OrgID": "team-a"}))
    api.instant("up", at=1783677636.0)
    # [({'__name__': 'up', 'instance': '127.0.0.1:9400', 'job': 'trainprof'},
    #   [(1783677636.0, 1.0)])]

A protected server is reached with an `Access` (`read_access`, the options
`add_access_arguments` adds): a bearer token or basic auth read from files, extra headers such
as a tenant's X-Scope-OrgID, TLS with a CA, a client certificate or no verification.

Every call goes through `PrometheusAPI.get`, in steps that are each the one place for their
concern: `_open` (the request with its headers, TLS and timeout; redirects as urllib follows
them), `_read` (the body, whole), `_decode` (the JSON envelope, `status: success`),
`_refused` (an HTTP error status), and the typed readers (`instant`, `range`,
`label_values`, ...) that turn `data` into Python values. A failure is a `PrometheusAPIError`:
one sentence naming the server, the headers sent left out (a server's own error text is
quoted as it came).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

Points = list[tuple[float, float]]
Series = list[tuple[dict[str, str], Points]]


class PrometheusAPIError(Exception):
    """A call that failed, as a sentence; `bad_input` separates a user's mistake (a URL or
    an access option: exit 2) from a server that failed or refused (exit 1)."""

    def __init__(self, message: str, bad_input: bool = False):
        super().__init__(message)
        self.bad_input = bad_input


# --- access ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Access:
    """How to reach a Prometheus that asks who is calling: the headers to send (bearer
    token, basic auth, X-Scope-OrgID for Mimir, Cortex and Thanos tenants) and TLS."""

    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False

    def context(self) -> ssl.SSLContext:
        try:
            ctx = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file:
                ctx.load_cert_chain(self.cert_file, self.key_file, password=_no_passphrase)
        except (OSError, ssl.SSLError, ValueError) as e:
            raise _option_error(f"TLS options: {getattr(e, 'strerror', None) or e}") from None
        if self.insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


def _no_passphrase() -> str:
    raise ValueError("the client key is encrypted; give an unencrypted key file")


def add_access_arguments(parser: argparse.ArgumentParser) -> None:
    """The options `access_from_args` reads, in a group of their own."""
    auth = parser.add_argument_group(
        "access to a Prometheus that asks who is calling (with --prometheus)"
    )
    auth.add_argument(
        "--bearer-token-file", metavar="FILE", help="send the token in FILE as a bearer token"
    )
    auth.add_argument("--basic-auth-user", metavar="NAME", help="basic auth user name")
    auth.add_argument(
        "--basic-auth-password-file", metavar="FILE", help="basic auth password, read from FILE"
    )
    auth.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="'NAME: VALUE'",
        help="an extra header, e.g. 'X-Scope-OrgID: team-a' for a Mimir, Cortex or Thanos "
        "tenant (repeatable)",
    )
    auth.add_argument("--ca-file", metavar="FILE", help="CA certificates to verify the server")
    auth.add_argument("--cert-file", metavar="FILE", help="client certificate (mutual TLS)")
    auth.add_argument("--key-file", metavar="FILE", help="the client certificate's key")
    auth.add_argument(
        "--insecure-skip-verify",
        action="store_true",
        help="do not verify the server's certificate (testing only)",
    )


def access_from_args(args: argparse.Namespace) -> Access:
    """The `Access` the options of `add_access_arguments` ask for."""
    return read_access(
        bearer_token_file=args.bearer_token_file,
        basic_auth_user=args.basic_auth_user,
        basic_auth_password_file=args.basic_auth_password_file,
        headers=args.header,
        ca_file=args.ca_file,
        cert_file=args.cert_file,
        key_file=args.key_file,
        insecure_skip_verify=args.insecure_skip_verify,
    )


def read_access(
    bearer_token_file: str | None = None,
    basic_auth_user: str | None = None,
    basic_auth_password_file: str | None = None,
    headers: Sequence[str] = (),
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    insecure_skip_verify: bool = False,
) -> Access:
    """--bearer-token-file, --basic-auth-*, --header and the TLS options; secrets are read
    from files so they never sit in a shell history or a process list.

    >>> read_access(headers=["X-Scope-OrgID: team-a"]).headers
    {'X-Scope-OrgID': 'team-a'}
    >>> read_access(headers=["X-Scope-OrgID team-a"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    trainprof...PrometheusAPIError: --header 'X-Scope-OrgID team-a'...: expected 'Name: value'
    """
    import base64

    sent: dict[str, str] = {}
    for header in headers:
        name, sep, value = header.partition(":")
        if not sep or not re.fullmatch(r"[A-Za-z0-9-]+", name.strip()):
            raise _option_error(f"--header {name.strip()!r}...: expected 'Name: value'")
        if "\n" in value or "\r" in value:
            raise _option_error(f"--header {name.strip()}: the value holds a line break")
        sent[name.strip()] = value.strip()
    if bearer_token_file and (basic_auth_user or basic_auth_password_file):
        raise _option_error("give --bearer-token-file or --basic-auth-user, not both")
    if bearer_token_file:
        sent["Authorization"] = f"Bearer {_secret(bearer_token_file, '--bearer-token-file')}"
    if basic_auth_password_file and not basic_auth_user:
        raise _option_error("--basic-auth-password-file needs --basic-auth-user")
    if basic_auth_user:
        password = (
            _secret(basic_auth_password_file, "--basic-auth-password-file")
            if basic_auth_password_file
            else ""
        )
        pair = f"{basic_auth_user}:{password}".encode()
        sent["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    if key_file and not cert_file:
        raise _option_error("--key-file needs --cert-file")
    return Access(sent, ca_file, cert_file, key_file, insecure_skip_verify)


def _option_error(message: str) -> PrometheusAPIError:
    return PrometheusAPIError(message, bad_input=True)


def _secret(path: str, option: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            value = f.read().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise _option_error(
            f"{option} {path}: cannot read: {getattr(e, 'strerror', None) or e}"
        ) from None
    if not value or "\n" in value:
        raise _option_error(f"{option} {path}: expected one line holding the secret")
    return value


# --- the client ------------------------------------------------------------------------------


class PrometheusAPI:
    """The calls of Prometheus' HTTP API trainprof makes, at `url` (the server's root).

    >>> PrometheusAPI("http://prometheus:9090/").url
    'http://prometheus:9090'
    >>> PrometheusAPI("prometheus:9090")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    trainprof...PrometheusAPIError: --prometheus 'prometheus:9090' is not an http(s) URL (...)
    """

    def __init__(self, url: str, timeout: float = 60.0, access: Access | None = None):
        """`timeout`: seconds each request may wait for the server."""
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise _option_error(
                f"--prometheus {url!r} is not an http(s) URL (e.g. http://prometheus:9090)"
            )
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.access = access or Access()
        handlers = []
        if parsed.scheme == "https":
            handlers.append(urllib.request.HTTPSHandler(context=self.access.context()))
        self._opener = urllib.request.build_opener(*handlers)

    # -- one request, in its steps

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """The `data` of Prometheus' answer to GET `path`: a dict for queries, a list for
        label values."""
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            with self._open(url) as response:
                body = self._read(response)
        except urllib.error.HTTPError as e:
            raise self._refused(e, path, params or {}) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise PrometheusAPIError(f"cannot reach Prometheus at {self.url}: {reason}") from None
        return self._decode(body)

    def _open(self, url: str) -> Any:
        """The response to GET `url` with the access's headers, over its TLS."""
        request = urllib.request.Request(url, headers=self.access.headers)
        return self._opener.open(request, timeout=self.timeout)

    def _read(self, response: Any) -> bytes:
        """The whole body."""
        return response.read()

    def _decode(self, body: bytes) -> Any:
        try:
            doc = json.loads(body)
        except ValueError:
            raise PrometheusAPIError(
                f"{self.url} did not answer like Prometheus (not JSON)"
            ) from None
        if doc.get("status") != "success":
            raise PrometheusAPIError(f"Prometheus at {self.url}: {doc.get('error', doc)}")
        return doc["data"]

    def _refused(
        self, e: urllib.error.HTTPError, path: str, params: Mapping[str, str]
    ) -> PrometheusAPIError:
        """The sentence for an HTTP error status."""
        if e.code in (401, 403):
            return PrometheusAPIError(
                f"Prometheus at {self.url} refused the credentials (HTTP {e.code}): "
                "see --bearer-token-file, --basic-auth-user, --header"
            )
        try:
            message = json.loads(e.read())["error"]
        except (ValueError, KeyError, TypeError):
            # Prometheus explains a refused query in JSON; anything else is not it.
            return PrometheusAPIError(
                f"{self.url} did not answer like Prometheus (HTTP {e.code} "
                f"for {path}): is it the Prometheus URL?"
            )
        return PrometheusAPIError(
            f"Prometheus at {self.url} rejected a query: {message}\n{params.get('query', '')}"
        )

    # -- the calls

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """An instant query's `data` as Prometheus gives it: `resultType` and `result`."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self.get("/api/v1/query", params)

    def instant(self, expr: str, at: float) -> Series:
        """Each series' value at `at` (a scalar as one series without labels)."""
        data = self.query(expr, at)
        if data["resultType"] == "scalar":
            return [({}, [(at, float(data["result"][1]))])]
        return [(r["metric"], [(at, float(r["value"][1]))]) for r in data["result"]]

    def range(self, expr: str, start: float, end: float, step: float) -> Series:
        """Values at `end` and every `step` before it back to `start` (Prometheus counts
        steps from the start; counting from the end keeps the last value at `end`)."""
        start = end - math.ceil((end - start) / step - 1e-9) * step
        data = self.get(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
        return [
            (r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in data["result"]
        ]

    def label_values(self, label: str, match: str) -> list[str]:
        return self.get(f"/api/v1/label/{label}/values", {"match[]": match})

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts the server's rule manager holds, pending and firing."""
        return self.get("/api/v1/alerts")["alerts"]

    def rule_groups(self) -> list[dict[str, Any]]:
        """The rule groups the server (or vmalert) evaluates, with each group's timing."""
        return self.get("/api/v1/rules")["groups"]

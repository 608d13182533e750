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
concern: `_fetch` (the request with its headers and TLS, through `contract.httpget`:
redirects only within the server, the answer capped at `max_bytes`, the whole request within
`timeout`), `_decode` (the JSON envelope, `status: success`), `_refused` (no usable answer:
unreachable, too slow, too large, redirected away, an HTTP error status), and the typed
readers (`instant`, `range`, `label_values`, ...) that check `data` and turn it into Python
values. A failure is a `PrometheusAPIError`: one sentence naming the server (and the query),
with every header value sent removed, whatever the server echoed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import re
import ssl
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from trainprof.contract import httpget

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
    """The `Access` the options of `add_access_arguments` ask for (each option is named as
    `read_access`'s parameter, but --header, which may be given many times)."""
    options = (
        "bearer_token_file",
        "basic_auth_user",
        "basic_auth_password_file",
        "ca_file",
        "cert_file",
        "key_file",
        "insecure_skip_verify",
    )
    return read_access(headers=args.header, **{name: getattr(args, name) for name in options})


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

MAX_ANSWER_BYTES = 32 * 2**20  # 1,000 GPUs x 200 points is 4.4 MiB; at the cap, 0.5 GB decoded
_RESULT_TYPES = ("vector", "scalar", "matrix", "string")


class _Malformed(ValueError):
    """What is wrong with an answer, said by the typed readers' checks."""


class PrometheusAPI:
    """The calls of Prometheus' HTTP API trainprof makes, at `url` (the server's root).

    >>> PrometheusAPI("http://prometheus:9090/").url
    'http://prometheus:9090'
    >>> PrometheusAPI("prometheus:9090")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    trainprof...PrometheusAPIError: --prometheus 'prometheus:9090' is not an http(s) URL (...)
    >>> PrometheusAPI("http://reporter:s3cret@prometheus:9090")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    trainprof...PrometheusAPIError: --prometheus http://prometheus:9090: a user or password \
in the URL would show in the process list; give them with --basic-auth-user and ...
    """

    def __init__(
        self,
        url: str,
        timeout: float = 60.0,
        access: Access | None = None,
        max_bytes: int = MAX_ANSWER_BYTES,
    ):
        """`timeout`: seconds each request may take in all (connect, headers and body);
        `max_bytes`: the largest answer read."""
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise _option_error(
                f"--prometheus {url!r} is not an http(s) URL (e.g. http://prometheus:9090)"
            )
        if parsed.username is not None or parsed.password is not None:
            raise _option_error(
                f"--prometheus {parsed.scheme}://{parsed.netloc.rpartition('@')[2]}: a user or "
                "password in the URL would show in the process list; give them with "
                "--basic-auth-user and --basic-auth-password-file"
            )
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.access = access or Access()
        self._context = self.access.context() if parsed.scheme == "https" else None
        self._hidden = httpget.secrets(self.access.headers)

    # -- one request, in its steps

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """The `data` of Prometheus' answer to GET `path`: a dict for queries, a list for
        label values."""
        params = params or {}
        url = f"{self.url}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        try:
            body = self._fetch(url)
        except httpget.FetchError as e:
            raise self._refused(e, path, params) from None
        return self._decode(body, path, params)

    def _fetch(self, url: str) -> bytes:
        """The body of GET `url` with the access's headers, over its TLS: redirects only
        within the server, at most `max_bytes`, within `timeout` (contract.httpget)."""
        return httpget.get(
            url, self.access.headers, self.timeout, self.max_bytes, context=self._context
        )

    def _decode(self, body: bytes, path: str, params: Mapping[str, str]) -> Any:
        """`data` of the JSON envelope, `status: success`."""
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            raise self._error(
                f"{self.url} did not answer like Prometheus (not JSON) for {_asked(path, params)}",
                bad_input=True,
            ) from None
        if not isinstance(doc, dict):
            raise self._malformed(f"the answer is {_kind(doc)}, not an object", path, params)
        if doc.get("status") != "success":
            raise self._error(f"Prometheus at {self.url}: {_short(doc.get('error', doc))}")
        if "data" not in doc:
            raise self._malformed("the answer has no data", path, params)
        return doc["data"]

    def _refused(
        self, e: httpget.FetchError, path: str, params: Mapping[str, str]
    ) -> PrometheusAPIError:
        """The sentence for a request that got no usable answer."""
        asked = _asked(path, params)
        if e.kind == "unreachable":
            return self._error(f"cannot reach Prometheus at {self.url}: {e}")
        if e.kind == "too_slow":
            return self._error(f"Prometheus at {self.url} gave {e} for {asked}")
        if e.kind == "too_large":
            return self._error(f"Prometheus at {self.url}: {e} for {asked}", bad_input=True)
        if e.kind == "redirect":
            return self._error(f"Prometheus at {self.url} {e}", bad_input=True)
        if e.status in (401, 403):
            return self._error(
                f"Prometheus at {self.url} refused the credentials (HTTP {e.status}): "
                "see --bearer-token-file, --basic-auth-user, --header"
            )
        try:
            message = json.loads(e.body)["error"]
        except (ValueError, KeyError, TypeError, RecursionError):
            # Prometheus explains a refused query in JSON; anything else is not it.
            return self._error(
                f"{self.url} did not answer like Prometheus (HTTP {e.status} "
                f"for {path}): is it the Prometheus URL?"
            )
        return self._error(
            f"Prometheus at {self.url} rejected a query: {_short(message)}\n"
            f"{params.get('query', '')}"
        )

    def _malformed(self, problem: str, path: str, params: Mapping[str, str]) -> PrometheusAPIError:
        return self._error(
            f"{self.url} did not answer like Prometheus: {problem}, for {_asked(path, params)}",
            bad_input=True,
        )

    def _error(self, message: str, bad_input: bool = False) -> PrometheusAPIError:
        """Every failure's sentence, with the headers sent left out whatever echoed them."""
        return PrometheusAPIError(httpget.redact(message, self._hidden), bad_input)

    @contextlib.contextmanager
    def _checked(self, path: str, params: Mapping[str, str]) -> Iterator[None]:
        """A typed reader's checks of `data`, failing as `_malformed`."""
        try:
            yield
        except _Malformed as e:
            raise self._malformed(str(e), path, params) from None

    # -- the calls

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """An instant query's `data` as Prometheus gives it: `resultType` and `result`."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.get("/api/v1/query", params)
        with self._checked("/api/v1/query", params):
            _result(data, _RESULT_TYPES)
        return data

    def instant(self, expr: str, at: float) -> Series:
        """Each series' value at `at` (a scalar as one series without labels)."""
        data = self.query(expr, at)
        with self._checked("/api/v1/query", {"query": expr}):
            result = _result(data, ("vector", "scalar"))
            if data["resultType"] == "scalar":
                return [({}, [(at, _sample(result)[1])])]
            return [(_labels(r), [(at, _sample(_field(r, "value"))[1])]) for r in _list(result)]

    def range(self, expr: str, start: float, end: float, step: float) -> Series:
        """Values at `end` and every `step` before it back to `start` (Prometheus counts
        steps from the start; counting from the end keeps the last value at `end`)."""
        start = end - math.ceil((end - start) / step - 1e-9) * step
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        data = self.get("/api/v1/query_range", params)
        with self._checked("/api/v1/query_range", params):
            return [
                (_labels(r), [_sample(p) for p in _list(_field(r, "values"))])
                for r in _list(_result(data, ("matrix",)))
            ]

    def label_values(self, label: str, match: str) -> list[str]:
        path, params = f"/api/v1/label/{label}/values", {"match[]": match}
        values = self.get(path, params)
        with self._checked(path, params):
            if not all(isinstance(v, str) for v in _list(values)):
                raise _Malformed("a label value is not a string")
        return values

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts the server's rule manager holds, pending and firing."""
        data = self.get("/api/v1/alerts")
        with self._checked("/api/v1/alerts", {}):
            return [_object(a) for a in _list(_field(_object(data), "alerts"))]

    def rule_groups(self) -> list[dict[str, Any]]:
        """The rule groups the server (or vmalert) evaluates, with each group's timing."""
        data = self.get("/api/v1/rules")
        with self._checked("/api/v1/rules", {}):
            return [_object(g) for g in _list(_field(_object(data), "groups"))]


# --- what an answer must hold ----------------------------------------------------------------


def _asked(path: str, params: Mapping[str, str]) -> str:
    query = params.get("query")
    return f"the query\n{query}" if query else path


def _short(value: Any) -> str:
    from trainprof.contract.validation import short

    return value if isinstance(value, str) and len(value) <= 2000 else short(value)


def _repr(value: Any) -> str:
    from trainprof.contract.validation import short

    return short(value)


def _kind(value: Any) -> str:
    """How an answer's part is named in a message.

    >>> _kind([]), _kind(None), _kind("x"), _kind(1.5)
    ('a list', 'null', 'a string', 'a number')
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "an object"
    return (
        "a list"
        if isinstance(value, list)
        else "a string"
        if isinstance(value, str)
        else "a number"
    )


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Malformed(f"expected an object, got {_kind(value)}")
    return value


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise _Malformed(f"expected a list, got {_kind(value)}")
    return value


def _field(value: Any, name: str) -> Any:
    if name not in _object(value):
        raise _Malformed(f"a result has no {name}")
    return value[name]


def _result(data: Any, kinds: Sequence[str]) -> Any:
    """`data`'s result, when its resultType is one of `kinds`.

    >>> _result({"result": []}, ("matrix",))
    Traceback (most recent call last):
    ...
    trainprof.engines.prometheus_api._Malformed: data has no resultType
    """
    if not isinstance(data, dict):
        raise _Malformed(f"data is {_kind(data)}, not an object")
    kind = data.get("resultType")
    if kind is None:
        raise _Malformed("data has no resultType")
    if kind not in kinds:
        raise _Malformed(f"resultType {_repr(kind)} where {' or '.join(kinds)} was expected")
    if "result" not in data:
        raise _Malformed("data has no result")
    return data["result"]


def _labels(series: Any) -> dict[str, str]:
    labels = _field(series, "metric")
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise _Malformed(f"a series' labels are {_repr(labels)}, not names and strings")
    return labels


def _sample(value: Any) -> tuple[float, float]:
    """A [time, "value"] pair as numbers; the time finite, the value any float Prometheus
    writes (NaN and ±Inf included).

    >>> _sample([1783677636.5, "NaN"])
    (1783677636.5, nan)
    >>> _sample([float("nan"), "1"])
    Traceback (most recent call last):
    ...
    trainprof.engines.prometheus_api._Malformed: a sample's time is nan, not a finite number
    """
    if not isinstance(value, list) or len(value) != 2:
        raise _Malformed(f"a sample is {_repr(value)}, not [time, value]")
    at, text = value
    if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at):
        raise _Malformed(f"a sample's time is {_repr(at)}, not a finite number")
    try:
        if isinstance(text, bool) or not isinstance(text, (str, int, float)):
            raise ValueError
        number = float(text)
    except (ValueError, OverflowError):
        raise _Malformed(f"a sample's value is {_repr(text)}, not a number") from None
    return float(at), number

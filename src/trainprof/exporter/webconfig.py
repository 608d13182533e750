"""`--web.config.file`: TLS and basic auth in the Prometheus exporter-toolkit format.

    tls_server_config:
      cert_file: server.crt             # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # optional, with client_ca_file
      client_ca_file: ca.crt
      min_version: TLS12                # default TLS12, as exporter-toolkit
    http_server_config:
      headers: {X-Frame-Options: deny}  # added to every response
    basic_auth_users:                   # bcrypt hashes, e.g. from `htpasswd -nBC 10 USER`
      prometheus: $2y$10$...

The same file works for node_exporter and this exporter. Basic auth is bounded: bcrypt
checks run one at a time (a flood of wrong passwords costs at most one core), a client
that fails 10 times is answered 429 without a check until its budget refills (one attempt
every 6 s), and an unknown user costs the same bcrypt work as a known one, so timing does
not tell which user names exist. A malformed hash and an encrypted TLS key are refused at
start-up. Every problem is reported at once with
its path; a key exporter-toolkit has and this exporter does not implement is an error, not
silently ignored, since it is usually a security setting. Basic auth needs the `bcrypt` module;
without it the exporter refuses to start rather than serve without the authentication the file
asks for.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import ssl
import threading
from collections.abc import Callable, Mapping
from typing import Any

from trainprof.contract.httpserve import EncryptedKey, RateLimiter, refuse_passphrase
from trainprof.contract.validation import (
    ConfigError,
    Problems,
    check_deep,
    describe,
    parse_yaml,
    read_text,
)

_TOP = ("tls_server_config", "http_server_config", "basic_auth_users")
_TLS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version")
_TLS_NOT_IMPLEMENTED = (
    "cert",
    "key",
    "client_ca",
    "cipher_suites",
    "curve_preferences",
    "prefer_server_cipher_suites",
    "client_allowed_sans",
)
_HTTP = ("headers", "http2")
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_CLIENT_AUTH_NOT_IMPLEMENTED = ("RequestClientCert", "RequireAnyClientCert")
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")
_BCRYPT_HASH = re.compile(r"^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")
FAILURE_BURST = 10  # failed logins a client may make at once
FAILURES_PER_MINUTE = 10  # and then one every 6 s
BCRYPT_WAIT = 10.0  # seconds a login waits for the one bcrypt slot before it gets 429


class WebConfigError(ConfigError):
    """A web configuration that cannot be used; the message lists every problem."""


class BcryptMissing(RuntimeError):
    """basic_auth_users is set but the bcrypt module is not installed."""


@dataclasses.dataclass
class WebConfig:
    ssl_context: ssl.SSLContext | None = None
    users: Mapping[str, str] = dataclasses.field(default_factory=dict)
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    check_password: Callable[[bytes, bytes], bool] | None = None

    def __post_init__(self) -> None:
        self._verified: set[bytes] = set()
        self._lock = threading.Lock()
        self._bcrypt = threading.Semaphore(1)
        self.failures = RateLimiter(FAILURES_PER_MINUTE, FAILURE_BURST)

    def authorized(self, user: str, password: str, client: str = "") -> bool | None:
        """True if the user's password matches its hash; None when `client` has failed too
        often (or the bcrypt slot stayed busy), answered without a check.

        bcrypt is slow on purpose (tens of milliseconds), and Prometheus sends the same
        credentials every scrape, so verified pairs are remembered by digest. An unknown
        user is checked against the costliest configured hash and refused, so it costs
        what a known user costs.
        """
        if self.check_password is None or not self.users:
            return False
        stored = self.users.get(user)
        known = stored is not None
        if stored is None:
            stored = max(self.users.values(), key=_cost)
        digest = hashlib.sha256("\0".join((user, password, stored)).encode()).digest()
        with self._lock:
            if known and digest in self._verified:
                return True
        if self.failures.wait(client):
            return None
        if not self._bcrypt.acquire(timeout=BCRYPT_WAIT):
            return None
        try:
            matches = self.check_password(password.encode(), stored.encode())
        finally:
            self._bcrypt.release()
        if not (known and matches):
            return False
        with self._lock:
            if len(self._verified) > 256:
                self._verified.clear()
            self._verified.add(digest)
        return True


def _cost(hashed: str) -> int:
    return int(hashed[4:6]) if hashed[4:6].isdigit() else 0


def load(path: str) -> WebConfig:
    """Read and check a web configuration file; raises WebConfigError or BcryptMissing."""
    try:
        data = parse_yaml(read_text(path), path)
    except ConfigError as e:
        raise WebConfigError(e.problems, e.source) from None
    return parse(data if data is not None else {}, path)


def parse(
    data: Any,
    path: str = "web config",
    check_password: Callable[[bytes, bytes], bool] | None = None,
) -> WebConfig:
    """Check a parsed configuration. `check_password` replaces bcrypt.checkpw (tests)."""
    problems = Problems()
    base = os.path.dirname(os.path.abspath(path)) if os.path.exists(path) else os.getcwd()
    try:
        check_deep(data, path)
    except ConfigError as e:
        raise WebConfigError(e.problems, e.source) from None
    if not isinstance(data, dict):
        problems.add("", f"expected a mapping with {', '.join(_TOP)}, got {describe(data)}")
        raise WebConfigError(problems.problems, path)
    problems.unknown_keys(data, "", _TOP)
    config = WebConfig()

    tls = data.get("tls_server_config")
    if tls is not None:
        config.ssl_context = _tls(tls, base, problems)
    http = data.get("http_server_config")
    if http is not None:
        config.headers = _http(http, problems)
    users = data.get("basic_auth_users")
    if users is not None:
        config.users = _users(users, problems)

    if problems:
        raise WebConfigError(problems.problems, path)
    if config.users:
        if check_password is None:
            try:
                import bcrypt
            except ModuleNotFoundError:
                raise BcryptMissing(
                    f"{path}: basic_auth_users needs bcrypt, which is not installed: "
                    "pip install 'trainprof[exporter]' (refusing to start without the "
                    "authentication the file asks for)"
                ) from None
            check_password = bcrypt.checkpw
        config.check_password = check_password
    return config


def _tls(tls: Any, base: str, problems: Problems) -> ssl.SSLContext | None:
    where = "tls_server_config."
    if not isinstance(tls, dict):
        problems.add("tls_server_config", "expected a mapping")
        return None
    problems.unknown_keys(
        tls, "tls_server_config", _TLS, _TLS_NOT_IMPLEMENTED, product="trainprof exporter"
    )
    missing = [k for k in ("cert_file", "key_file") if not tls.get(k)]
    for key in missing:
        problems.add(f"{where}{key}", "required for TLS")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    for key, attribute in (("min_version", "minimum_version"), ("max_version", "maximum_version")):
        if key in tls:
            version = _VERSIONS.get(str(tls[key]))
            if version is None:
                problems.add(f"{where}{key}", f"{tls[key]!r} is not one of {', '.join(_VERSIONS)}")
            else:
                setattr(context, attribute, version)
    if not missing:
        cert, key = (_path(base, tls[k]) for k in ("cert_file", "key_file"))
        try:
            context.load_cert_chain(cert, key, password=refuse_passphrase(key))
        except EncryptedKey as e:
            problems.add(f"{where}key_file", str(e))
        except (OSError, ssl.SSLError) as e:
            problems.add(
                f"{where}cert_file/key_file",
                f"cannot load {cert} and {key}: {getattr(e, 'strerror', None) or e}",
            )
    auth = str(tls.get("client_auth_type", "NoClientCert"))
    if auth in _CLIENT_AUTH_NOT_IMPLEMENTED:
        problems.add(
            f"{where}client_auth_type",
            f"{auth} is not implemented by trainprof "
            "exporter; use RequireAndVerifyClientCert or VerifyClientCertIfGiven",
        )
    elif auth not in _CLIENT_AUTH:
        problems.add(
            f"{where}client_auth_type", f"{auth!r} is not one of {', '.join(_CLIENT_AUTH)}"
        )
    else:
        context.verify_mode = _CLIENT_AUTH[auth]
        ca = tls.get("client_ca_file")
        if auth != "NoClientCert" and not ca:
            problems.add(f"{where}client_ca_file", f"required with client_auth_type {auth}")
        if ca:
            try:
                context.load_verify_locations(_path(base, ca))
            except (OSError, ssl.SSLError) as e:
                problems.add(
                    f"{where}client_ca_file",
                    f"cannot load {_path(base, ca)}: {getattr(e, 'strerror', None) or e}",
                )
    return context


def _http(http: Any, problems: Problems) -> dict[str, str]:
    if not isinstance(http, dict):
        problems.add("http_server_config", "expected a mapping")
        return {}
    problems.unknown_keys(http, "http_server_config", _HTTP)
    headers = http.get("headers") or {}
    if not isinstance(headers, dict):
        problems.add("http_server_config.headers", "expected a mapping of header: value")
        return {}
    out = {}
    for name, value in headers.items():
        text = str(value)
        if not str(name).replace("-", "").isalnum() or "\n" in text or "\r" in text:
            problems.add(f"http_server_config.headers.{name}", "not a valid header")
        else:
            out[str(name)] = text
    # http2 is accepted for files shared with node_exporter; this server speaks HTTP/1.1.
    return out


def _users(users: Any, problems: Problems) -> dict[str, str]:
    if not isinstance(users, dict):
        problems.add("basic_auth_users", "expected a mapping of user: bcrypt hash")
        return {}
    out = {}
    for user, hashed in users.items():
        if not isinstance(hashed, str) or not hashed.startswith(_BCRYPT_PREFIXES):
            problems.add(
                f"basic_auth_users.{user}",
                "not a bcrypt hash (expected $2y$...; "
                "make one with htpasswd -nBC 10 USER); plaintext passwords are "
                "not accepted",
            )
        elif not _BCRYPT_HASH.match(hashed):
            problems.add(
                f"basic_auth_users.{user}",
                "a malformed bcrypt hash (expected $2y$, a cost from 04 to 31, $ and 53 "
                "characters of ./A-Za-z0-9; make one with htpasswd -nBC 10 USER)",
            )
        else:
            out[str(user)] = hashed
    return out


def _path(base: str, name: Any) -> str:
    return os.path.join(base, str(name))

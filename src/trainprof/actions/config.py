"""The StopTraining receiver's configuration: checked all at once, like the rule configuration.

    listen: 127.0.0.1:9095
    tls: {cert_file: /etc/tls/tls.crt, key_file: /etc/tls/tls.key}   # optional: serve HTTPS
    dry_run: true                    # the default: decide and audit, stop nothing
    token_file: /etc/trainprof-actions/token      # or token_env: NAME; at least 16 characters
    audit_log: /var/lib/trainprof/actions.jsonl   # default trainprof-actions-audit.jsonl;
                                     # "-" is standard output, forgotten at a restart
    limits: {max_body_bytes: 1048576, requests_per_minute: 300, burst: 50}
    cooldown: 10m                    # a job stopped this recently is not stopped again
    allow:
      namespaces: [team-a]
      training_jobs: ["bert-.*"]     # regular expressions, matched against the whole name
    rules:                           # opt-in: only these rules act
      CPUBottleneck: stop
      MaxInitializationTime: stop
      LowGPUUtilization: notify      # audit-logged, nothing stopped
    kubernetes:                      # or `local:` (below)
      resource: Job                  # Job | PyTorchJob | JobSet
      action: suspend                # suspend | delete
    # local:
    #   signal: SIGTERM
    #   jobs: {bert-large: {pid_file: /run/train/bert-large.pid, process_group: true}}

Problems are reported together, each with its path and the nearest valid key; secrets (the
bearer token) are read separately, at start-up, by `read_token`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from collections.abc import Mapping
from typing import Any

from trainprof.actions import kubernetes, local
from trainprof.contract import httpserve
from trainprof.contract.durations import parse_duration
from trainprof.contract.names import JOB_LABEL
from trainprof.contract.validation import (
    ConfigError,
    Problem,
    Problems,
    check_deep,
    describe,
    nearest,
    parse_yaml,
    read_text,
)
from trainprof.rules.catalog import registry

RULE_ACTIONS = ("stop", "notify")
MIN_TOKEN_LENGTH = 16
# A file by default: the receiver reads its own audit log back at start-up to remember which
# firings it already handled, so a restart does not stop the same firing again.
DEFAULT_AUDIT_LOG = "trainprof-actions-audit.jsonl"
_TOP = (
    "listen",
    "tls",
    "dry_run",
    "token_file",
    "token_env",
    "audit_log",
    "limits",
    "cooldown",
    "allow",
    "rules",
    "local",
    "kubernetes",
)
TLS_KEYS = ("cert_file", "key_file")
LIMIT_KEYS = ("max_body_bytes", "requests_per_minute", "burst")
_ALLOW = ("namespaces", "training_jobs")
_LOCAL = ("signal", "jobs")
_LOCAL_JOB = ("pid_file", "process_group")
_KUBERNETES = ("resource", "action", "api_url", "token_file", "ca_file", "name_label")
_LOOPBACK_URL = re.compile(r"^http://(127\.0\.0\.1|localhost|\[::1\])(:\d+)?/?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 1 << 20
    # Alertmanager sends one request per group and flush: a fleet of jobs needs headroom.
    requests_per_minute: int = 300
    burst: int = 50


@dataclasses.dataclass(frozen=True)
class KubernetesTarget:
    resource: str
    action: str
    api_url: str | None = None  # None: the in-cluster address
    token_file: str = kubernetes.IN_CLUSTER_TOKEN
    ca_file: str | None = kubernetes.IN_CLUSTER_CA
    name_label: str = JOB_LABEL


@dataclasses.dataclass(frozen=True)
class ActionsConfig:
    rules: Mapping[str, str]  # rule name -> stop | notify
    token_file: str | None = None
    token_env: str | None = None
    listen: tuple[str, int] = ("127.0.0.1", 9095)
    tls: tuple[str, str] | None = None  # (cert_file, key_file)
    dry_run: bool = True
    audit_log: str = DEFAULT_AUDIT_LOG
    limits: Limits = Limits()
    cooldown: float = 600.0
    namespaces: tuple[str, ...] = ()
    training_jobs: tuple[re.Pattern, ...] = ()
    signal: str = "SIGTERM"
    local_jobs: Mapping[str, local.LocalJob] = dataclasses.field(default_factory=dict)
    kubernetes: KubernetesTarget | None = None

    @property
    def target(self) -> str:
        if self.kubernetes:
            return "kubernetes"
        return "local" if self.local_jobs else "none"


class _Checker(Problems):
    def problem(self, path: str, message: str) -> None:
        self.add(path, message)

    def mapping(self, value: Any, path: str, keys: tuple[str, ...]) -> Mapping:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.problem(path, f"expected a mapping, got {describe(value)}")
            return {}
        self.unknown_keys(value, path, keys)
        return value

    def string(self, data: Mapping, key: str, path: str, default: str | None = None):
        value = data.get(key, default)
        if value is not None and not (isinstance(value, str) and value):
            self.problem(path, f"expected a non-empty string, got {describe(value)}")
            return default
        return value

    def boolean(self, data: Mapping, key: str, path: str, default: bool) -> bool:
        value = data.get(key, default)
        if not isinstance(value, bool):
            self.problem(path, f"expected true or false, got {describe(value)}")
            return default
        return value

    def positive_int(self, data: Mapping, key: str, path: str, default: int) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.problem(path, f"expected a whole number of 1 or more, got {describe(value)}")
            return default
        return value

    def string_list(self, data: Mapping, key: str, path: str) -> list[str]:
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.problem(path, f"expected a list of strings, got {describe(value)}")
            return []
        return value

    # --- sections ------------------------------------------------------------------------

    def listen(self, value: Any) -> tuple[str, int]:
        try:
            return parse_listen(value)
        except ValueError as e:
            self.problem("listen", str(e))
            return ("127.0.0.1", 9095)

    def rules(self, value: Any) -> dict[str, str]:
        names = [r.name for r in registry.alerting_rules()]
        if not isinstance(value, Mapping) or not value:
            self.problem(
                "rules",
                "expected a mapping of rule name to stop or notify, e.g. "
                "{CPUBottleneck: stop}; no rule acts unless listed here",
            )
            return {}
        out = {}
        for name, action in value.items():
            path = f"rules.{name}"
            match = next((n for n in names if n.lower() == str(name).lower()), None)
            if match is None:
                self.problem(
                    path,
                    "not an alerting rule of the catalog"
                    + nearest(str(name), names)
                    + f"; rules: {', '.join(names)}",
                )
                continue
            if not self.one_of(path, action, RULE_ACTIONS):
                continue
            out[match] = action
        return out

    def patterns(self, values: list[str], path: str) -> tuple[re.Pattern, ...]:
        out = []
        for i, text in enumerate(values):
            try:
                out.append(re.compile(text))
            except re.error as e:
                self.problem(f"{path}[{i}]", f"{text!r} is not a valid regular expression: {e}")
        return tuple(out)

    def local(self, value: Any) -> tuple[str, dict[str, local.LocalJob]]:
        data = self.mapping(value, "local", _LOCAL)
        signal = data.get("signal", "SIGTERM")
        if not self.one_of("local.signal", signal, local.SIGNALS):
            signal = "SIGTERM"
        jobs_value = data.get("jobs")
        if not isinstance(jobs_value, Mapping) or not jobs_value:
            self.problem(
                "local.jobs", "expected a mapping of training_job to {pid_file: /absolute/path}"
            )
            return signal, {}
        jobs = {}
        for name, spec in jobs_value.items():
            path = f"local.jobs.{name}"
            if not isinstance(name, str) or not name:
                self.problem(path, "expected a training_job name")
                continue
            spec = self.mapping(spec, path, _LOCAL_JOB)
            pid_file = self.string(spec, "pid_file", f"{path}.pid_file")
            if pid_file is None:
                self.problem(f"{path}.pid_file", "required: the file holding the job's PID")
                continue
            if not os.path.isabs(pid_file):
                self.problem(f"{path}.pid_file", f"{pid_file!r} is not an absolute path")
                continue
            group = self.boolean(spec, "process_group", f"{path}.process_group", False)
            jobs[name] = local.LocalJob(pid_file, group)
        return signal, jobs

    def kubernetes(self, value: Any) -> KubernetesTarget | None:
        data = self.mapping(value, "kubernetes", _KUBERNETES)
        resource = data.get("resource")
        known_resource = self.one_of("kubernetes.resource", resource, kubernetes.KINDS)
        action = data.get("action", "suspend")
        known_action = self.one_of("kubernetes.action", action, kubernetes.ACTIONS)
        api_url = self.string(data, "api_url", "kubernetes.api_url")
        if api_url and not (api_url.startswith("https://") or _LOOPBACK_URL.match(api_url)):
            self.problem(
                "kubernetes.api_url",
                f"{api_url!r}: use https:// (the token must "
                "not travel in clear), or http:// on loopback",
            )
        token_file = self.string(
            data, "token_file", "kubernetes.token_file", kubernetes.IN_CLUSTER_TOKEN
        )
        ca_file = self.string(data, "ca_file", "kubernetes.ca_file", kubernetes.IN_CLUSTER_CA)
        name_label = self.string(data, "name_label", "kubernetes.name_label", JOB_LABEL)
        if not (known_resource and known_action):
            return None
        assert token_file is not None and name_label is not None  # they have defaults
        return KubernetesTarget(
            str(resource), str(action), api_url, token_file, ca_file, name_label
        )


def parse_listen(value: Any) -> tuple[str, int]:
    """("127.0.0.1", 9095) from "127.0.0.1:9095"; IPv6 as "[::1]:9095".

    The syntax is `trainprof.contract.httpserve.parse_listen_address`'s; the receiver also asks for
    an IP address (or localhost) and a fixed port, so its exposure is explicit.
    """
    try:
        host, port = httpserve.parse_listen_address(value, default_port=9095, allow_any_host=False)
        if host != "localhost":
            ipaddress.ip_address(host)
        if port > 0:
            return host, port
    except ValueError:
        pass
    raise ValueError(
        f"{describe(value)} is not host:port with an IP address or localhost "
        "(e.g. 127.0.0.1:9095, 0.0.0.0:9095, [::1]:9095)"
    )


def load_actions_config(data: Any, source: str = "configuration") -> ActionsConfig:
    """Check a parsed configuration; raises ConfigError listing every problem."""
    check_deep(data, source)
    c = _Checker()
    if not isinstance(data, Mapping):
        raise ConfigError([Problem("", f"expected a mapping, got {describe(data)}")], source)
    c.mapping(data, "", _TOP)

    listen = c.listen(data.get("listen", "127.0.0.1:9095"))
    tls = None
    if "tls" in data:
        tls_data = c.mapping(data["tls"], "tls", TLS_KEYS)
        cert = c.string(tls_data, "cert_file", "tls.cert_file")
        key = c.string(tls_data, "key_file", "tls.key_file")
        if cert is None or key is None:
            c.problem("tls", "set both cert_file and key_file (PEM)")
        else:
            tls = (cert, key)
    dry_run = c.boolean(data, "dry_run", "dry_run", True)
    token_file = c.string(data, "token_file", "token_file")
    token_env = c.string(data, "token_env", "token_env")
    if (token_file is None) == (token_env is None):
        c.problem(
            "token_file",
            "set exactly one of token_file and token_env: Alertmanager "
            "must present this bearer token (http_config.authorization)",
        )
    if token_env is not None and not _ENV_NAME.match(token_env):
        c.problem("token_env", f"{token_env!r} is not an environment variable name")
    audit_log = c.string(data, "audit_log", "audit_log", DEFAULT_AUDIT_LOG)

    limits_data = c.mapping(data.get("limits"), "limits", LIMIT_KEYS)
    limits = Limits(
        c.positive_int(
            limits_data, "max_body_bytes", "limits.max_body_bytes", Limits.max_body_bytes
        ),
        c.positive_int(
            limits_data,
            "requests_per_minute",
            "limits.requests_per_minute",
            Limits.requests_per_minute,
        ),
        c.positive_int(limits_data, "burst", "limits.burst", Limits.burst),
    )
    cooldown = 600.0
    if "cooldown" in data:
        try:
            cooldown = parse_duration(data["cooldown"])
        except ValueError as e:
            c.problem("cooldown", str(e))

    rules = c.rules(data.get("rules"))
    allow = c.mapping(data.get("allow"), "allow", _ALLOW)
    namespaces = c.string_list(allow, "namespaces", "allow.namespaces")
    for i, ns in enumerate(namespaces):
        if not kubernetes.valid_namespace(ns):
            c.problem(f"allow.namespaces[{i}]", f"{ns!r} is not a namespace name")
    job_patterns = c.string_list(allow, "training_jobs", "allow.training_jobs")
    training_jobs = c.patterns(job_patterns, "allow.training_jobs")

    signal, target = "SIGTERM", None
    local_jobs: dict[str, local.LocalJob] = {}
    if "local" in data and "kubernetes" in data:
        c.problem("kubernetes", "configure one target: local or kubernetes, not both")
    elif "local" in data:
        signal, local_jobs = c.local(data["local"])
        if not job_patterns:  # default: exactly the configured jobs
            training_jobs = tuple(re.compile(re.escape(name)) for name in local_jobs)
    elif "kubernetes" in data:
        target = c.kubernetes(data["kubernetes"])
        if not namespaces:
            c.problem(
                "allow.namespaces",
                "required with a kubernetes target: the namespaces whose jobs may be stopped",
            )
        if not job_patterns:
            c.problem(
                "allow.training_jobs",
                'required with a kubernetes target; [".*"] '
                "allows every job of the allowed namespaces",
            )
    stopping = sorted(name for name, action in rules.items() if action == "stop")
    if stopping and "local" not in data and "kubernetes" not in data:
        c.problem(
            "rules",
            f"{', '.join(stopping)} set to stop, but no target is configured (local or kubernetes)",
        )

    if c.problems:
        raise ConfigError(c.problems, source)
    return ActionsConfig(
        rules=rules,
        token_file=token_file,
        token_env=token_env,
        listen=listen,
        tls=tls,
        dry_run=dry_run,
        audit_log=audit_log,
        limits=limits,
        cooldown=cooldown,
        namespaces=tuple(namespaces),
        training_jobs=training_jobs,
        signal=signal,
        local_jobs=local_jobs,
        kubernetes=target,
    )


def read_actions_config(path: str) -> ActionsConfig:
    """Load a YAML file; ConfigError for unreadable files and invalid YAML too."""
    return load_actions_config(parse_yaml(read_text(path), path), path)


def read_token(config: ActionsConfig, source: str = "configuration") -> str:
    """The bearer token Alertmanager must send; ConfigError if it is missing or weak."""
    if config.token_env is not None:
        path, token = "token_env", os.environ.get(config.token_env)
        if token is None:
            raise ConfigError(
                [Problem(path, f"environment variable {config.token_env} is not set")], source
            )
    elif config.token_file is None:
        raise ConfigError([Problem("", "configure token_file or token_env")], source)
    else:
        path = "token_file"
        try:
            with open(config.token_file, encoding="utf-8") as f:
                token = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(
                [
                    Problem(
                        path,
                        f"cannot read {config.token_file}: {getattr(e, 'strerror', None) or e}",
                    )
                ],
                source,
            ) from None
    token = token.strip()
    if len(token) < MIN_TOKEN_LENGTH or any(ch.isspace() for ch in token):
        raise ConfigError(
            [
                Problem(
                    path,
                    f"the token must be at least {MIN_TOKEN_LENGTH} "
                    "characters without spaces (e.g. `openssl rand "
                    "-hex 32`)",
                )
            ],
            source,
        )
    return token


def resolve_api_url(config: ActionsConfig, source: str = "configuration") -> str:
    if config.kubernetes is None:
        raise ValueError("the configuration has no kubernetes target")
    url = config.kubernetes.api_url or kubernetes.in_cluster_url()
    if url is None:
        raise ConfigError(
            [
                Problem(
                    "kubernetes.api_url",
                    "not running inside a cluster (KUBERNETES_SERVICE_HOST is unset); set api_url",
                )
            ],
            source,
        )
    return url

"""`trainprof actions`: the StopTraining receiver's commands.

trainprof actions serve -c actions.yaml [--listen 0.0.0.0:9095] [--dry-run]
trainprof actions check -c actions.yaml
trainprof actions rbac -c actions.yaml [--service-account-namespace trainprof]
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import ssl
import sys
import threading
from typing import TYPE_CHECKING

from trainprof.cliargs import EXIT_BAD_INPUT, EXIT_FAILED

if TYPE_CHECKING:
    from trainprof.cliargs import Subparsers


def add_parser(commands: Subparsers) -> argparse.ArgumentParser:
    actions = commands.add_parser(
        "actions", help="StopTraining: an Alertmanager webhook receiver that stops jobs"
    )
    actions.set_defaults(run=run)
    sub = actions.add_subparsers(dest="actions_command", metavar="SUBCOMMAND", required=True)
    serve = sub.add_parser("serve", help="receive Alertmanager webhooks and act on them")
    serve.add_argument(
        "-c",
        "--config",
        required=True,
        metavar="FILE",
        help="receiver configuration (YAML; see docs/actions.md)",
    )
    serve.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="address to listen on (default: the configuration's listen)",
    )
    serve.add_argument(
        "--dry-run",
        action="store_true",
        help="decide and audit but stop nothing, whatever the configuration says",
    )
    check = sub.add_parser("check", help="check a configuration and its token")
    check.add_argument("-c", "--config", required=True, metavar="FILE")
    rbac = sub.add_parser(
        "rbac", help="print the least-privilege RBAC for a configuration's Kubernetes target"
    )
    rbac.add_argument("-c", "--config", required=True, metavar="FILE")
    rbac.add_argument(
        "--service-account-namespace",
        default="trainprof",
        metavar="NS",
        help="namespace the receiver runs in (default: trainprof)",
    )
    return actions


def run(args: argparse.Namespace) -> int:
    from trainprof.actions import config as cfg
    from trainprof.rules.config import ConfigError, Problem

    try:
        config = cfg.read_actions_config(args.config)
        if args.actions_command == "rbac":
            return _rbac(config, args.service_account_namespace)
        if getattr(args, "listen", None):
            try:
                config = dataclasses.replace(config, listen=cfg.parse_listen(args.listen))
            except ValueError as e:
                raise ConfigError([Problem("", str(e))], "--listen") from None
        if getattr(args, "dry_run", False):
            config = dataclasses.replace(config, dry_run=True)
        token = cfg.read_token(config, args.config)
        api_url = cfg.resolve_api_url(config, args.config) if config.kubernetes else None
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.actions_command == "check":
        print(_summary(config))
        print("ok")
        return 0
    return _serve(config, token, api_url)


def _summary(config) -> str:
    rules = ", ".join(f"{r}={a}" for r, a in config.rules.items())
    target = config.target
    if config.kubernetes:
        target = f"kubernetes {config.kubernetes.action} {config.kubernetes.resource}"
    elif config.local_jobs:
        target = f"local {config.signal} to {', '.join(config.local_jobs)}"
    return (
        f"{'dry run' if config.dry_run else 'LIVE'}: {rules}; target {target}; "
        f"namespaces {', '.join(config.namespaces) or '(any)'}; jobs "
        f"{', '.join(p.pattern for p in config.training_jobs) or '(none)'}"
    )


def _rbac(config, namespace: str) -> int:
    from trainprof.actions import kubernetes
    from trainprof.generation.render import to_yaml

    if not config.kubernetes:
        print("error: the configuration has no kubernetes target", file=sys.stderr)
        return EXIT_BAD_INPUT
    docs = kubernetes.rbac(
        config.kubernetes.resource,
        config.kubernetes.action,
        list(config.namespaces),
        namespace=namespace,
    )
    sys.stdout.write("---\n".join(to_yaml(d) for d in docs))
    return 0


def _serve(config, token: str, api_url: str | None) -> int:
    from trainprof.actions import audit, decide, kubernetes
    from trainprof.actions.server import ActionsHTTPServer, Receiver, tls_context

    context = None
    if config.tls:
        try:
            context = tls_context(*config.tls)
        except (OSError, ssl.SSLError, ValueError) as e:
            print(
                f"error: tls: cannot load {' / '.join(config.tls)}: "
                f"{getattr(e, 'strerror', None) or e}",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
    client = None
    if config.kubernetes and api_url:  # resolve_api_url gave one for every kubernetes target
        try:
            client = kubernetes.Client(
                api_url, config.kubernetes.token_file, config.kubernetes.ca_file
            )
        except (OSError, ssl.SSLError) as e:
            print(
                f"error: kubernetes.ca_file: cannot load {config.kubernetes.ca_file}: "
                f"{getattr(e, 'strerror', None) or e}",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
    try:
        log = audit.AuditLog(config.audit_log)
    except OSError as e:
        print(
            f"error: cannot open the audit log {config.audit_log}: {e.strerror or e}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    actions = decide.Actions(config, decide.stopper(config, client))
    restored = actions.remember(audit.history(config.audit_log))
    if config.audit_log == "-" and not config.dry_run:
        print(
            "trainprof actions: warning: audit_log is standard output, so a restarted "
            "receiver forgets which firings it already handled and may stop a job again "
            "when Alertmanager resends them; set audit_log to a file on a persistent volume",
            file=sys.stderr,
        )
    try:
        server = ActionsHTTPServer(config.listen, Receiver(config, token, actions, log), context)
    except OSError as e:
        print(
            f"error: cannot listen on {config.listen[0]}:{config.listen[1]}: {e.strerror or e}",
            file=sys.stderr,
        )
        log.close()
        return EXIT_FAILED
    host, port = server.socket.getsockname()[:2]
    log.write(
        "start",
        listen=f"{host}:{port}",
        dry_run=config.dry_run,
        rules=dict(config.rules),
        target=config.target,
        restored=restored,
    )
    print(
        f"trainprof actions: listening on {host}:{port} "
        f"({'https' if config.tls else 'http'}); {_summary(config)}",
        file=sys.stderr,
    )

    def stop(signum, frame):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        log.write("stop")
        log.close()
    return 0

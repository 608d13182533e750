"""`trainprof exporter`: node_exporter-style flags around `trainprof.exporter.start`.

    trainprof exporter --web.listen-address 127.0.0.1:9945
    trainprof exporter --no-collector.gpu --path.procfs /host/proc --identity.node "$NODE_NAME"
    trainprof exporter --rules.config rules.yaml --record run.jsonl.gz

Runs until SIGTERM or SIGINT, then stops sampling and flushes the recording. Exit codes: 0 after
a clean stop, 1 when it cannot run (port in use, recording not writable, bcrypt missing),
2 for bad input (a flag, the rule configuration, the web configuration).
"""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
import threading
from typing import TYPE_CHECKING

from trainprof.cliargs import EXIT_BAD_INPUT, EXIT_FAILED, duration, positive_int
from trainprof.exporter.sources.base import DISK_EXCLUDE, NETWORK_EXCLUDE
from trainprof.exporter.sources.collectors import COLLECTORS

if TYPE_CHECKING:
    from trainprof.cliargs import Subparsers

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}
log = logging.getLogger("trainprof.exporter")


def add_parser(commands: Subparsers) -> argparse.ArgumentParser:
    """`trainprof exporter`, and `trainprof record FILE`: the exporter writing a recording."""
    exporter = commands.add_parser(
        "exporter", help="sample the host and its GPUs and serve /metrics for the rules"
    )
    add_arguments(exporter)
    exporter.set_defaults(run=run)
    record = commands.add_parser(
        "record",
        help="record this host's samples for `trainprof replay` (the exporter, "
        "writing every sample to FILE; it serves /metrics too)",
    )
    record.add_argument(
        "output",
        metavar="FILE",
        help="recording to write (.jsonl, or .jsonl.gz compressed); add the "
        "training ranks' steps with trainprof.start(record=...)",
    )
    add_arguments(record)
    record.set_defaults(run=_run_record)
    return exporter


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The exporter's flags."""
    from trainprof._version import __version__

    parser.add_argument("--version", action="version", version=f"trainprof exporter {__version__}")
    web = parser.add_argument_group("web")
    web.add_argument(
        "--web.listen-address",
        dest="listen_address",
        default=":9945",
        metavar="[HOST]:PORT",
        help="where to serve metrics (default :9945, every interface; port 0 picks a free one)",
    )
    web.add_argument(
        "--web.telemetry-path",
        dest="telemetry_path",
        default="/metrics",
        metavar="PATH",
        help="path of the metrics (default /metrics)",
    )
    web.add_argument(
        "--web.config.file",
        dest="web_config",
        metavar="FILE",
        help="TLS and basic auth, in the Prometheus exporter-toolkit format",
    )
    web.add_argument(
        "--web.max-connections",
        dest="max_connections",
        type=positive_int,
        default=64,
        metavar="N",
        help="refuse new connections (503) beyond N open ones (default 64)",
    )

    collectors = parser.add_argument_group("collectors")
    for name in COLLECTORS:
        collectors.add_argument(
            f"--collector.{name}",
            dest=f"collector_{name}",
            default=True,
            action=argparse.BooleanOptionalAction,
            help=f"sample {name} (default: on)",
        )
    collectors.add_argument(
        "--collector.disk.device-exclude",
        dest="disk_exclude",
        default=DISK_EXCLUDE,
        metavar="REGEX",
        help="block devices to leave out (default: loop, RAM and partition devices)",
    )
    collectors.add_argument(
        "--collector.network.device-exclude",
        dest="network_exclude",
        default=NETWORK_EXCLUDE,
        metavar="REGEX",
        help="network interfaces to leave out (default: ^lo$)",
    )
    collectors.add_argument(
        "--collector.gpu.dcgm-exporter",
        dest="dcgm_exporter",
        metavar="URL",
        help="read the GPUs from this NVIDIA dcgm-exporter (http://127.0.0.1:9400/metrics on "
        "its node) instead of NVML; user:password@ in the URL is sent as basic authentication",
    )
    collectors.add_argument(
        "--collector.gpu.dcgm-exporter.poll-interval",
        dest="dcgm_poll_interval",
        type=duration,
        default=1.0,
        metavar="DURATION",
        help="how often to read dcgm-exporter (default 1s; its values change when it collects, "
        "every 30s in the GPU Operator's default)",
    )
    collectors.add_argument(
        "--path.procfs",
        dest="procfs",
        metavar="PATH",
        help="proc filesystem to read (a DaemonSet mounts the host's at /host/proc; default /proc)",
    )

    sampling = parser.add_argument_group("sampling")
    sampling.add_argument(
        "--datapoint-interval",
        dest="datapoint_interval",
        type=duration,
        metavar="DURATION",
        help="time between two samples, SageMaker's datapoint (default "
        "0.5s, or the --rules.config's datapoint_interval)",
    )
    sampling.add_argument(
        "--rules.config",
        dest="rules_config",
        metavar="FILE",
        help="the rule configuration the rules were compiled from: its "
        "bottleneck thresholds are counted even off the default grid",
    )
    sampling.add_argument(
        "--record",
        metavar="FILE",
        help="also write every sample to FILE for trainprof replay (.gz: compressed)",
    )

    identity = parser.add_argument_group(
        "identity",
        "Labels on every series. Flags win over TRAINPROF_NODE / TRAINPROF_JOB; "
        "outside Kubernetes node defaults to the hostname, inside it neither is "
        "emitted unless set (scrape relabelling attaches them). An empty value "
        "emits nothing.",
    )
    identity.add_argument("--identity.node", dest="node", metavar="NAME")
    identity.add_argument("--identity.training-job", dest="training_job", metavar="NAME")
    parser.add_argument(
        "--log.level", dest="log_level", choices=tuple(_LEVELS), default="info", help="default info"
    )


def _run_record(args: argparse.Namespace) -> int:
    if args.record is not None and args.record != args.output:
        print(
            f"error: trainprof record writes to its FILE argument ({args.output}); "
            f"--record {args.record} is the exporter's option (trainprof exporter "
            "--record FILE): give one file, as `trainprof record FILE`",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    args.record = args.output
    return run(args)


def run(args: argparse.Namespace, stop: threading.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or `stop` is set); the exit code."""
    from trainprof import exporter
    from trainprof.exporter import webconfig
    from trainprof.exporter.server import parse_listen_address
    from trainprof.exporter.sources.collectors import default_sources, set_procfs
    from trainprof.rules.config import ConfigError
    from trainprof.training import identity

    _configure_logging(args.log_level)
    try:
        host, port = parse_listen_address(args.listen_address)
    except ValueError as e:
        return _bad(f"--web.listen-address {e}")
    if not args.telemetry_path.startswith("/"):
        return _bad(f"--web.telemetry-path {args.telemetry_path!r} must start with /")
    for flag, text in (
        ("--collector.disk.device-exclude", args.disk_exclude),
        ("--collector.network.device-exclude", args.network_exclude),
    ):
        try:
            re.compile(text)
        except re.error as e:
            return _bad(f"{flag} {text!r} is not a regular expression: {e}")
    if args.procfs is not None:
        try:
            set_procfs(args.procfs)
        except ValueError as e:
            return _bad(f"--path.procfs {e}")
    web = None
    if args.web_config:
        try:
            web = webconfig.load(args.web_config)
        except webconfig.WebConfigError as e:
            return _bad(f"--web.config.file {e}")
        except webconfig.BcryptMissing as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
    enabled = [name for name in COLLECTORS if getattr(args, f"collector_{name}")]
    if not enabled:
        return _bad("every collector is off; enable at least one (--collector.cpu, ...)")
    if args.dcgm_exporter is not None:
        from trainprof.exporter.sources.dcgm_exporter import check_url

        try:
            check_url(args.dcgm_exporter)
        except ValueError as e:
            return _bad(f"--collector.gpu.dcgm-exporter {e}")
        if not args.collector_gpu:
            return _bad("--collector.gpu.dcgm-exporter is set but the gpu collector is off")
    sources = default_sources(
        enabled,
        disk_exclude=args.disk_exclude,
        network_exclude=args.network_exclude,
        dcgm_exporter=args.dcgm_exporter,
        dcgm_poll_interval=args.dcgm_poll_interval,
    )
    labels = identity.exporter_labels(args.node, args.training_job)
    log.info(identity.describe(labels))
    try:
        running = exporter.start(
            port,
            address=host,
            sources=sources,
            datapoint_interval=args.datapoint_interval,
            identity=labels,
            rules_config=args.rules_config,
            record=args.record,
            web=web,
            telemetry_path=args.telemetry_path,
            max_connections=args.max_connections,
        )
    except ConfigError as e:
        return _bad(f"--rules.config {e}")
    except ValueError as e:
        return _bad(str(e))
    except OSError as e:
        print(f"error: {e.strerror or e}", file=sys.stderr)
        return EXIT_FAILED
    log.info("collectors: %s", ", ".join(enabled))

    stop = stop or threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        while not stop.wait(1.0):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.info("stopping")
        running.stop()
    return 0


def _bad(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


class _Stderr(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time, not the one at start-up."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _configure_logging(level: str) -> None:
    logger = logging.getLogger("trainprof")
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(
            logging.Formatter("%(asctime)s level=%(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S")
        )
        logger.addHandler(handler)
    logger.setLevel(_LEVELS[level])

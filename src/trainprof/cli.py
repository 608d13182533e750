"""The `trainprof` command line.

    trainprof rules compile [-c rules.yaml] -o out/ [--format rules|prometheusrule]
    trainprof rules validate [-c rules.yaml]
    trainprof rules list
    trainprof replay SOURCE [--rules rules.yaml] [--scrape-interval 15s] [--json -|FILE]
    trainprof report (--prometheus URL --job NAME [--from T --to T] | --replay SOURCE) -o FILE
    trainprof generate [--check]
    trainprof actions serve|check|rbac -c actions.yaml
    trainprof exporter [--web.listen-address :9945] [--no-collector.gpu] ...
    trainprof record FILE [exporter flags]

Exit codes: 0 success, 1 an operation failed (I/O, a missing tool), 2 bad input.
"""

from __future__ import annotations

import argparse
import os
import sys

from trainprof._version import __version__
from trainprof.names import EXIT_BAD_INPUT, EXIT_FAILED

_OPTIONAL_MODULES = {"yaml", "grafanalib", "psutil", "pynvml"}
_MISSING_EXTRA = (
    "{module} is not installed. Install the command-line tools with:\n"
    "    pip install 'trainprof[all]'"
)


def _duration(text: str) -> float:
    from trainprof.durations import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than 0s")
    return seconds


def _label(text: str) -> tuple[str, str]:
    from trainprof.rules.promql import LABEL_NAME

    key, sep, value = text.partition("=")
    if not sep or not LABEL_NAME.match(key):
        raise argparse.ArgumentTypeError(f"{text!r} is not name=value with a valid label name")
    return key, value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainprof",
        description="SageMaker Debugger's profiler rules for any training job Prometheus can see.",
    )
    parser.add_argument("--version", action="version", version=f"trainprof {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    rules = commands.add_parser("rules", help="compile, check and list profiler rules")
    rule_commands = rules.add_subparsers(dest="rules_command", metavar="SUBCOMMAND", required=True)

    def config_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "-c",
            "--config",
            metavar="FILE",
            help="rule configuration: YAML, JSON, a DescribeTrainingJob response, "
            "or Python with SageMaker SDK rule calls; - reads stdin "
            "(default: ProfilerReport with SageMaker's defaults)",
        )
        p.add_argument(
            "--scrape-interval",
            type=_duration,
            metavar="DURATION",
            help="how often Prometheus scrapes the exporters (default: the "
            "configuration's scrape_interval, else 15s)",
        )
        p.add_argument(
            "--datapoint-interval",
            metavar="DURATION",
            help="what one SageMaker datapoint lasts (default: the "
            "configuration's datapoint_interval, else 0.5s)",
        )

    compile_ = rule_commands.add_parser("compile", help="write Prometheus rule files")
    config_args(compile_)
    compile_.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="DIR",
        help="directory to write into (created if missing), or - for stdout",
    )
    compile_.add_argument(
        "--format",
        choices=("rules", "prometheusrule"),
        default="rules",
        help="plain rule file (Prometheus, Thanos, Mimir, vmalert) or a "
        "prometheus-operator PrometheusRule (default: rules)",
    )
    compile_.add_argument(
        "--name", default="trainprof-rules", help="PrometheusRule name (default: trainprof-rules)"
    )
    compile_.add_argument("--namespace", help="PrometheusRule namespace")
    compile_.add_argument(
        "--label",
        type=_label,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra PrometheusRule label, e.g. release=kube-prometheus-stack (repeatable)",
    )
    compile_.add_argument("-q", "--quiet", action="store_true", help="do not print warnings")

    validate = rule_commands.add_parser(
        "validate", help="check a configuration and show the resolved parameters"
    )
    config_args(validate)

    rule_commands.add_parser("list", help="the rule catalog with SageMaker's defaults")

    replay = commands.add_parser(
        "replay", help="which rules would have fired on a recorded job, and when"
    )
    replay.add_argument(
        "source",
        metavar="SOURCE",
        help="SageMaker Debugger profiler output directory, or a trainprof "
        "recording (.jsonl[.gz] file or a directory of them)",
    )
    replay.add_argument(
        "--rules",
        metavar="FILE",
        help="rule configuration, as for `rules compile` (default: "
        "ProfilerReport with SageMaker's defaults)",
    )
    replay.add_argument(
        "--scrape-interval",
        type=_duration,
        default=15.0,
        metavar="DURATION",
        help="scrape interval to replay at (default: 15s)",
    )
    replay.add_argument(
        "--datapoint-interval",
        type=_duration,
        metavar="DURATION",
        help="what one datapoint lasts (default: the recording's sampling interval)",
    )
    replay.add_argument("--format", choices=("auto", "sagemaker", "trainprof"), default="auto")
    replay.add_argument(
        "--job",
        metavar="NAME",
        help="training_job label of the replayed series (default: the SageMaker job folder's name)",
    )
    replay.add_argument(
        "--json", metavar="FILE", help="write the verdicts as JSON to FILE, or - for stdout"
    )

    from trainprof.report.cli import add_parser as add_report_parser

    add_report_parser(commands)

    generate = commands.add_parser("generate", help="rewrite every generated artifact")
    generate.add_argument(
        "--check",
        action="store_true",
        help="only report artifacts that differ from the generator's output",
    )
    generate.add_argument("--root", default=".", help="repository root (default: .)")

    from trainprof.actions import cli as actions_cli

    actions_cli.add_parser(commands)
    from trainprof.exporter.cli import add_arguments as exporter_arguments

    exporter = commands.add_parser(
        "exporter", help="sample the host and its GPUs and serve /metrics for the rules"
    )
    exporter_arguments(exporter, _duration)
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
    exporter_arguments(record, _duration)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "rules":
            return _rules(args)
        if args.command == "replay":
            from trainprof.replay.cli import main as replay_main

            return replay_main(args)
        if args.command == "report":
            from trainprof.report.cli import main as report_main

            return report_main(args)
        if args.command == "generate":
            from trainprof import generate

            return generate.main(args.root, check=args.check)
        if args.command == "actions":
            from trainprof.actions import cli as actions_cli

            return actions_cli.run(args)
        if args.command == "record":
            from trainprof.exporter.cli import run

            args.record = args.output
            return run(args)
        if args.command == "exporter":
            from trainprof.exporter.cli import run

            return run(args)
    except ModuleNotFoundError as e:
        if e.name not in _OPTIONAL_MODULES:
            raise
        print(_MISSING_EXTRA.format(module=e.name), file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:
        return EXIT_FAILED
    return EXIT_FAILED


def _rules(args: argparse.Namespace) -> int:
    from trainprof.rules.config import ConfigError

    if args.rules_command == "list":
        _print_catalog()
        return 0
    from trainprof.rules import files
    from trainprof.rules.compiler import compile_rules

    try:
        config = files.read_config(args.config, args.scrape_interval, args.datapoint_interval)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    compiled = compile_rules(config)
    quiet = getattr(args, "quiet", False)
    if not quiet:
        for w in compiled.warnings:
            print(f"warning: {w}", file=sys.stderr)

    if args.rules_command == "validate":
        _print_resolved(config)
        return 0

    source = "defaults" if args.config is None else os.path.basename(args.config)
    generator = f"trainprof rules compile from {source}"
    text = files.render(
        compiled,
        args.format,
        generator,
        name=args.name,
        namespace=args.namespace,
        labels=dict(args.label),
    )
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    path = os.path.join(args.output, files.OUTPUT_NAMES[args.format])
    try:
        os.makedirs(args.output, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        print(f"error: cannot write {path}: {e.strerror or e}", file=sys.stderr)
        return EXIT_FAILED
    n_alerts = sum(1 for g in compiled.groups for r in g["rules"] if "alert" in r)
    n_records = sum(1 for g in compiled.groups for r in g["rules"] if "record" in r)
    if not quiet:
        print(
            f"wrote {path}: {len(config.rules)} rules -> {n_records} recording and "
            f"{n_alerts} alerting rules in {len(compiled.groups)} groups",
            file=sys.stderr,
        )
    return 0


def _print_catalog() -> None:
    from trainprof.rules import catalog

    for spec in catalog.CATALOG:
        params = ", ".join(f"{p.name}={p.default}" for p in spec.params)
        print(f"{spec.name:<24} {spec.severity:<8} {spec.summary}")
        print(f"{'':<24} {params}")


def _print_resolved(config) -> None:
    print(
        f"datapoint_interval {config.datapoint_interval:g}s, scrape_interval "
        f"{config.scrape_interval:g}s, patience_mode {config.patience_mode}"
    )
    for instance in config.rules:
        values = ", ".join(f"{k}={v}" for k, v in instance.values.items() if v is not None)
        patience = instance.patience_mode if "patience" in instance.values else "-"
        print(f"{instance.spec.name:<24} {instance.severity:<8} patience {patience:<6} {values}")
    print(f"ok: {len(config.rules)} rules")


if __name__ == "__main__":
    sys.exit(main())

"""The `trainprof` command line.

    trainprof rules compile [-c rules.yaml] -o out/ [--format rules|prometheusrule|helm-values]
    trainprof rules validate [-c rules.yaml]
    trainprof rules list
    trainprof replay SOURCE [--rules rules.yaml] [--scrape-interval 15s] [--json -|FILE]
    trainprof report (--prometheus URL --job NAME [--from T --to T] | --replay SOURCE) -o FILE
    trainprof trace summarize TRACE... [--json -|FILE] [--top N]
    trainprof generate [--check]                    (inside a source checkout only)
    trainprof export rules|dashboards|alerting|chart -o DIR [-c rules.yaml] [--force]
    trainprof actions serve|check|rbac -c actions.yaml
    trainprof exporter [--web.listen-address :9945] [--no-collector.gpu] ...
    trainprof record FILE [exporter flags]
    trainprof stack [-c rules.yaml] [--keep] [-- python train.py ...]

Exit codes: 0 success, 1 an operation failed (I/O, a missing tool), 2 bad input or a
missing extra (one line naming it: pip install 'trainprof[...]').
"""

from __future__ import annotations

import argparse
import sys

from trainprof import extras
from trainprof._version import __version__
from trainprof.cliargs import EXIT_BAD_INPUT, EXIT_FAILED

_EXPORTER_COMMANDS = ("exporter", "record")


def _missing_extra(error: ModuleNotFoundError, command: str | None) -> str | None:
    """The one line for an optional module missing under `command`, or None when the module
    is no extra's (a bug, left to raise). The exporter's commands need only its extra.

    >>> print(_missing_extra(ModuleNotFoundError(name="pynvml"), "exporter"))
    trainprof exporter needs pynvml, which is not installed: pip install 'trainprof[exporter]'
    >>> print(_missing_extra(ModuleNotFoundError(name="numpy"), "replay"))
    trainprof replay needs numpy, which is not installed: pip install 'trainprof[all]'
    """
    if isinstance(error, extras.MissingExtra):
        return str(error)
    extra = extras.extra_of(error.name)
    if extra is None:
        return None
    if command in _EXPORTER_COMMANDS and extra == "all":
        extra = "exporter"  # PyYAML: the exporter's own extra has it
    feature = f"trainprof {command}" if command else "trainprof"
    return str(extras.missing(error.name or "", feature, extra))


def _parser() -> argparse.ArgumentParser:
    """Every sub-command is a module with `add_parser(subparsers)` and `run(args) -> int`."""
    from trainprof.actions import cli as actions
    from trainprof.engines import stack_cli as stack
    from trainprof.exporter import cli as exporter
    from trainprof.generation import export, generate
    from trainprof.replay import cli as replay
    from trainprof.report import cli as report
    from trainprof.rules import cli as rules
    from trainprof.trace import cli as trace

    parser = argparse.ArgumentParser(
        prog="trainprof",
        description="SageMaker Debugger's profiler rules for any training job Prometheus can see.",
    )
    parser.add_argument("--version", action="version", version=f"trainprof {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (rules, replay, report, trace, export, generate, actions, exporter, stack):
        command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = None
    try:
        args = _parser().parse_args(argv)
        return int(args.run(args))
    except ModuleNotFoundError as e:
        line = _missing_extra(e, getattr(args, "command", None))
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())

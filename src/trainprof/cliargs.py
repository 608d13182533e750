"""Argument types and exit codes every `trainprof` sub-command shares.

A sub-CLI is a module with `add_parser(subparsers)` and `run(args) -> int`; it takes its
argument types from here, so no sub-CLI reaches into `trainprof.cli` or another sub-CLI.

    >>> duration("4m10s"), label("release=kube-prometheus-stack"), positive_int("3")
    (250.0, ('release', 'kube-prometheus-stack'), 3)
    >>> duration("0s")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '0s' must be longer than 0s
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from trainprof.contract.names import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from typing import TypeAlias

    # What `ArgumentParser.add_subparsers()` returns; each sub-CLI's `add_parser` takes it.
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

    from trainprof.rules.config import RulesConfig

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_OK",
    "add_choice_argument",
    "add_json_argument",
    "add_rule_config_arguments",
    "add_source_argument",
    "source_setting",
    "duration",
    "kubernetes_name",
    "label",
    "linked_below",
    "namespace",
    "not_written",
    "positive_int",
    "read_rule_config",
    "write_below",
    "write_json",
    "write_output",
]


def duration(text: str) -> float:
    """A DURATION argument (500ms, 15s, 4m10s) in seconds; longer than zero."""
    from trainprof.contract.durations import parse_duration

    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be longer than 0s")
    return seconds


def source_setting(text: str) -> tuple[str, ...]:
    """A `source` setting: `trainprof`, `dcgm`, `node_exporter` or a combination.

    >>> source_setting("dcgm,node_exporter")
    ('dcgm', 'node_exporter')
    """
    from trainprof.sources.options import parse_sources

    try:
        return parse_sources(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def label(text: str) -> tuple[str, str]:
    """A NAME=VALUE argument: a label of a Kubernetes object, as the API server checks it.

    >>> label("app.kubernetes.io/part-of=ml-platform")
    ('app.kubernetes.io/part-of', 'ml-platform')
    >>> label("__name__=x")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: '__name__' is not a Kubernetes label key: ...
    """
    from trainprof.deploy.kubernetes_names import label_key_problem, label_value_problem

    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r} is not name=value")
    problem = label_key_problem(key) or label_value_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return key, value


def kubernetes_name(text: str) -> str:
    """The name of a Kubernetes object (a DNS-1123 subdomain)."""
    from trainprof.deploy.kubernetes_names import object_name_problem

    problem = object_name_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def namespace(text: str) -> str:
    """A Kubernetes namespace (a DNS-1123 label)."""
    from trainprof.deploy.kubernetes_names import namespace_problem

    problem = namespace_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


def positive_int(text: str) -> int:
    """A whole number, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def add_rule_config_arguments(parser: argparse.ArgumentParser) -> None:
    """-c/--config, --scrape-interval and --datapoint-interval, as every command that reads
    a rule configuration takes them."""
    parser.add_argument(
        "-c",
        "--config",
        metavar="FILE",
        help="rule configuration: YAML, JSON, a DescribeTrainingJob response, "
        "or Python with SageMaker SDK rule calls; - reads stdin "
        "(default: ProfilerReport with SageMaker's defaults)",
    )
    parser.add_argument(
        "--scrape-interval",
        type=duration,
        metavar="DURATION",
        help="how often Prometheus scrapes the exporters (default: the "
        "configuration's scrape_interval, else 15s)",
    )
    parser.add_argument(
        "--datapoint-interval",
        metavar="DURATION",
        help="what one SageMaker datapoint lasts (default: the "
        "configuration's datapoint_interval, else 0.5s)",
    )
    add_source_argument(parser)


def read_rule_config(args: argparse.Namespace) -> RulesConfig:
    """The rule configuration the options of `add_rule_config_arguments` ask for; a
    ConfigError where it is wrong."""
    from trainprof.rules import files

    return files.read_config(
        args.config, args.scrape_interval, args.datapoint_interval, args.source
    )


def add_choice_argument(
    parser: argparse.ArgumentParser, flag: str, choices: tuple[str, ...], text: str
) -> None:
    """An option that takes one of `choices`, the first by default: `text` (its help) ends by
    saying so."""
    parser.add_argument(
        flag, choices=choices, default=choices[0], help=f"{text} (default: {choices[0]})"
    )


def add_source_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source",
        type=source_setting,
        metavar="SOURCES",
        help="where the GPU and host signals come from: trainprof (its exporter), dcgm "
        "(dcgm-exporter's GPU series), node_exporter (its host series), or a combination "
        "such as dcgm,node_exporter (default: the configuration's source, else trainprof)",
    )


def add_json_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """--json FILE|-: write `what` (the verdicts, the summary) as JSON; see `write_json`."""
    parser.add_argument(
        "--json", metavar="FILE", help=f"write {what} as JSON to FILE, or - for stdout"
    )


def write_json(path: str, doc: Any) -> int:
    """Write `doc` as indented JSON to the file at `path`, or to stdout for -, as
    `write_output` does.

    >>> write_json("-", {"rules": {"CPUBottleneck": {"fired": True}}})
    {
      "rules": {
        "CPUBottleneck": {
          "fired": true
        }
      }
    }
    0
    """
    import json

    return write_output(path, json.dumps(doc, indent=2) + "\n")


class LinkedOutput(OSError):
    """A file trainprof would write below an output directory is a symbolic link."""


def linked_below(directory: str, relative: str) -> str | None:
    """The first path from `directory` (excluded: the user named it) down to
    `directory/relative` that is a symbolic link, or None.

    >>> linked_below("no-such-folder", "trainprof/Chart.yaml") is None
    True
    """
    path = directory
    for part in os.path.normpath(relative).split(os.sep):
        path = os.path.join(path, part)
        if os.path.islink(path):
            return path
    return None


def write_below(directory: str, relative: str, text: str) -> str:
    """Write `text` to `directory/relative` (its folders made), never through a symbolic
    link below `directory`: one planted there would have trainprof overwrite the file it
    points at. Raises LinkedOutput naming the link, or OSError; returns the path."""
    path = os.path.join(directory, relative)
    linked = linked_below(directory, relative)
    if linked is None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        linked = linked_below(directory, relative)
    if linked is not None:
        raise LinkedOutput(f"{linked} is a symbolic link; trainprof does not write through one")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError:
        if os.path.islink(path):  # planted between the check and the open
            raise LinkedOutput(
                f"{path} is a symbolic link; trainprof does not write through one"
            ) from None
        raise
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def not_written(path: str, e: OSError) -> str:
    """Why the file at `path` was not written, for an error line.

    >>> not_written("out/rules.yaml", FileNotFoundError(2, "No such file or directory"))
    'cannot write out/rules.yaml: No such file or directory'
    """
    if isinstance(e, LinkedOutput):
        return f"refusing to write {path}: {e}"
    return f"cannot write {path}: {e.strerror or e}"


def write_output(path: str, text: str) -> int:
    """Write `text` to the file at `path`, or to stdout for -; the exit code: EXIT_OK, or
    EXIT_FAILED with the error on stderr.

    >>> import contextlib
    >>> with contextlib.redirect_stderr(sys.stdout):
    ...     write_output("no-such-folder/verdicts.json", "{}")
    error: cannot write no-such-folder/verdicts.json: No such file or directory
    1
    """
    if path == "-":
        sys.stdout.write(text)
        return EXIT_OK
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        print(f"error: {not_written(path, e)}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK

"""Every `trainprof` sub-command is one module with `add_parser(subparsers)` and
`run(args) -> int`, and shares its argument types through `trainprof.cliargs`."""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
from pathlib import Path

import pytest

from trainprof import cli, cliargs

SUB_CLIS = (
    "rules",
    "replay",
    "report",
    "compare",
    "trace",
    "export",
    "generate",
    "actions",
    "exporter",
    "record",
    "stack",
)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_sub_command_runs_through_its_module():
    commands = _subparsers(cli._parser())
    assert tuple(commands) == SUB_CLIS
    for name, parser in commands.items():
        run = parser.get_default("run")
        assert callable(run), f"{name} sets no run"
        module = sys.modules[run.__module__]
        assert callable(getattr(module, "add_parser", None)), f"{module.__name__}.add_parser"
        assert callable(getattr(module, "run", None)), f"{module.__name__}.run"
        assert list(inspect.signature(module.add_parser).parameters) == ["commands"]


def test_no_sub_cli_reaches_into_the_top_level_cli():
    """The shared argument types live in cliargs: a sub-CLI importing `trainprof.cli`
    (as report/cli once did for `_duration`) closes an import cycle."""
    for name in (c for c in SUB_CLIS if c != "record"):  # record is the exporter's module
        module = sys.modules[_subparsers(cli._parser())[name].get_default("run").__module__]
        tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                assert node.module != "trainprof.cli", f"{module.__name__} imports trainprof.cli"


@pytest.mark.parametrize(
    "parse, text, message",
    [
        (cliargs.duration, "0s", "'0s' must be longer than 0s"),
        (cliargs.duration, "soon", "soon"),
        (cliargs.label, "__name__=x", "'__name__' is not a Kubernetes label key"),
        (cliargs.label, "team=a b", "'a b' is not a Kubernetes label value"),
        (cliargs.label, "release", "'release' is not name=value"),
        (cliargs.positive_int, "0", "'0' must be at least 1"),
        (cliargs.positive_int, "two", "'two' is not a whole number"),
    ],
)
def test_shared_argument_types_name_the_bad_value(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse(text)


def test_shared_argument_types_parse():
    assert cliargs.duration("4m10s") == 250.0
    assert cliargs.label("release=kube-prometheus-stack") == ("release", "kube-prometheus-stack")
    assert cliargs.label("empty=") == ("empty", "")
    assert cliargs.positive_int("3") == 3


def test_a_bad_argument_exits_2_naming_it(capsys):
    for argv in (
        ["rules", "compile", "-o", "-", "--scrape-interval", "0s"],
        ["replay", "x", "--scrape-interval", "-1s"],
        ["report", "--replay", "x", "-o", "-", "--scrape-interval", "later"],
        ["exporter", "--web.max-connections", "0"],
        ["record", "out.jsonl", "--web.max-connections", "many"],
    ):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == cliargs.EXIT_BAD_INPUT, argv
        assert "error: argument" in capsys.readouterr().err, argv

"""`trainprof export`: the generated artifacts for a pip user, without the source tree.

    trainprof export rules -o out/                  rules/ as committed (SageMaker's defaults)
    trainprof export rules -c mine.yaml -o out/     compiled from a configuration instead
    trainprof export dashboards|alerting|chart -o out/ [--force]

Writes the same files `make generate` commits (from the same generators), flattened under the
output directory: `rules/trainprof.rules.yaml` -> `out/trainprof.rules.yaml`, the chart under
`out/trainprof/`. An existing file is never overwritten unless `--force` is given, and never
through a symbolic link below the directory, even with it (a link planted there would have
the export overwrite the file it points at); then nothing at all is written, so a
half-exported directory cannot happen. `rules compile -o DIR` writes the same way
(`cliargs.write_below`).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainprof.cliargs import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    add_rule_config_arguments,
    read_rule_config,
)

if TYPE_CHECKING:
    from trainprof.cliargs import Subparsers

KINDS = ("rules", "dashboards", "alerting", "chart")
_PREFIX = {
    "rules": "rules/",
    "dashboards": "dashboards/",
    "alerting": "alerting/",
    "chart": "helm/",
}


class ExportError(Exception):
    pass


def files(kind: str, config=None, config_name: str | None = None) -> dict[str, str]:
    """Output-relative path -> content for one kind of artifact."""
    from trainprof.generation import generate

    prefix = _PREFIX[kind]
    makers: dict[str, Callable[[], str]] = {
        path[len(prefix) :]: make
        for path, make in generate.artifacts().items()
        if path.startswith(prefix)
    }
    if config is not None:
        makers.update(_from_config(kind, config, config_name or "configuration"))
    return {path: make() for path, make in makers.items()}


def _from_config(kind: str, config, name: str) -> dict[str, Callable[[], str]]:
    from trainprof.rules import files as rule_files
    from trainprof.rules.compiler import compile_rules

    generator = f"trainprof export {kind} from {name}"
    compiled = compile_rules(config)
    if kind == "rules":
        return {
            rule_files.OUTPUT_NAMES[fmt]: functools.partial(
                rule_files.render, compiled, fmt, generator
            )
            for fmt in ("rules", "prometheusrule")
        }
    if kind == "dashboards":
        from trainprof import dashboards

        return {
            os.path.basename(path): functools.partial(dashboards.render, path, config, compiled)
            for path in dashboards.DASHBOARDS
        }
    if kind == "chart":
        return {
            "trainprof.values.yaml": lambda: rule_files.render(
                compiled, "helm-values", generator, warn=rule_files.print_warning
            )
        }
    raise ExportError(
        "alerting does not depend on a rule configuration (its routes follow the rule "
        "catalog); export it without -c"
    )


def write(out_dir: str, produced: dict[str, str], force: bool = False) -> list[str]:
    """Write every file, or none if one exists and `force` is off, or if one would be
    written through a symbolic link (even with `force`); the paths written."""
    from trainprof.cliargs import linked_below, write_below

    linked = sorted({link for rel in produced if (link := linked_below(out_dir, rel))})
    if linked:
        raise ExportError(
            f"refusing to write through {len(linked)} symbolic link(s):\n  "
            + "\n  ".join(linked[:10])
            + "\nremove them, or choose another -o directory"
        )
    paths = {os.path.join(out_dir, rel): text for rel, text in sorted(produced.items())}
    existing = [p for p in paths if os.path.lexists(p)]
    if existing and not force:
        shown = "\n  ".join(existing[:10])
        more = f"\n  ... and {len(existing) - 10} more" if len(existing) > 10 else ""
        raise ExportError(
            f"refusing to overwrite {len(existing)} existing file(s):\n  {shown}{more}\n"
            "pass --force to replace them, or choose another -o directory"
        )
    return [write_below(out_dir, rel, text) for rel, text in sorted(produced.items())]


def add_parser(commands: Subparsers) -> argparse.ArgumentParser:
    export = commands.add_parser(
        "export",
        help="write the generated rules, dashboards, alerting config or Helm chart to a "
        "directory (what the repository commits; never overwrites without --force)",
    )
    export.set_defaults(run=run)
    export.add_argument("kind", choices=KINDS)
    add_rule_config_arguments(export)
    export.add_argument(
        "-o", "--output", required=True, metavar="DIR", help="directory to write into"
    )
    export.add_argument("--force", action="store_true", help="replace files that exist")
    return export


def run(args: argparse.Namespace) -> int:
    from trainprof.rules.config import ConfigError

    config = None
    custom = args.config or args.scrape_interval or args.datapoint_interval or args.source
    if custom:
        try:
            config = read_rule_config(args)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
    name = os.path.basename(args.config) if args.config else "defaults"
    from trainprof.rules.compiler import MissingRecording

    try:
        produced = files(args.kind, config, name)
        written = write(args.output, produced, force=args.force)
    except MissingRecording as e:
        print(f"error: cannot draw the {args.kind} for {name}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT if "refusing" not in str(e) else EXIT_FAILED
    except OSError as e:
        print(f"error: cannot write under {args.output}: {e.strerror or e}", file=sys.stderr)
        return EXIT_FAILED
    print(f"wrote {len(written)} {args.kind} file(s) under {args.output}", file=sys.stderr)
    return 0

"""`trainprof rules`: compile, validate and list the profiler rules.

trainprof rules compile [-c rules.yaml] -o out/ [--format rules|prometheusrule]
                        [--tier all|shard|global]
trainprof rules validate [-c rules.yaml]
trainprof rules list
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from trainprof.cliargs import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    add_choice_argument,
    add_rule_config_arguments,
    kubernetes_name,
    label,
    namespace,
    not_written,
    read_rule_config,
    write_below,
)

if TYPE_CHECKING:
    from trainprof.cliargs import Subparsers
    from trainprof.rules.config import RulesConfig


def add_parser(commands: Subparsers) -> argparse.ArgumentParser:
    rules = commands.add_parser("rules", help="compile, check and list profiler rules")
    rules.set_defaults(run=run)
    rule_commands = rules.add_subparsers(dest="rules_command", metavar="SUBCOMMAND", required=True)

    compile_ = rule_commands.add_parser("compile", help="write Prometheus rule files")
    add_rule_config_arguments(compile_)
    compile_.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="DIR",
        help="directory to write into (created if missing), or - for stdout",
    )
    add_choice_argument(
        compile_,
        "--format",
        ("rules", "prometheusrule", "helm-values"),
        "plain rule file (Prometheus, Thanos, Mimir, vmalert), a "
        "prometheus-operator PrometheusRule, or a values file for the helm/trainprof "
        "chart (helm install -f trainprof.values.yaml)",
    )
    compile_.add_argument(
        "--name",
        type=kubernetes_name,
        default="trainprof-rules",
        help="PrometheusRule name (default: trainprof-rules)",
    )
    compile_.add_argument("--namespace", type=namespace, help="PrometheusRule namespace")
    compile_.add_argument(
        "--label",
        type=label,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra PrometheusRule label, e.g. release=kube-prometheus-stack (repeatable)",
    )
    add_choice_argument(
        compile_,
        "--tier",
        ("all", "shard", "global"),
        "all: every group, for one Prometheus; shard: node_exporter's per-core "
        "reduction, for Prometheus servers sharded by node; global: the rest, for the server "
        "that federates the shards' per-node recordings (docs/sources.md)",
    )
    compile_.add_argument("-q", "--quiet", action="store_true", help="do not print warnings")

    validate = rule_commands.add_parser(
        "validate", help="check a configuration and show the resolved parameters"
    )
    add_rule_config_arguments(validate)

    rule_commands.add_parser("list", help="the rule catalog with SageMaker's defaults")
    return rules


def run(args: argparse.Namespace) -> int:
    from trainprof.rules.config import ConfigError

    if args.rules_command == "list":
        _print_catalog()
        return 0
    from trainprof.rules import files
    from trainprof.rules.compiler import compile_rules

    try:
        config = read_rule_config(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    compiled = compile_rules(config)
    quiet = getattr(args, "quiet", False)
    if not quiet:
        for w in compiled.warnings:
            files.print_warning(w)

    if args.rules_command == "validate":
        _print_resolved(config)
        return 0

    if args.tier != "all":
        import dataclasses

        from trainprof.sources.tiers import tier

        if args.format == "helm-values":
            print("error: --tier takes --format rules or prometheusrule", file=sys.stderr)
            return EXIT_BAD_INPUT
        try:
            compiled = dataclasses.replace(compiled, groups=tier(compiled.groups, args.tier))
        except ValueError as e:
            print(f"error: --tier {args.tier}: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
    source = "defaults" if args.config is None else os.path.basename(args.config)
    generator = f"trainprof rules compile from {source}"
    text = files.render(
        compiled,
        args.format,
        generator,
        name=args.name,
        namespace=args.namespace,
        labels=dict(args.label),
        warn=None if quiet else files.print_warning,
    )
    if not quiet:
        _print_process_settings(config, args.config)
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    path = os.path.join(args.output, files.OUTPUT_NAMES[args.format])
    try:
        write_below(args.output, files.OUTPUT_NAMES[args.format], text)
    except OSError as e:
        print(f"error: {not_written(path, e)}", file=sys.stderr)
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


def _print_process_settings(config: RulesConfig, source: str | None) -> None:
    """Which settings the training processes must be given for the tensor rules."""
    from trainprof.rules.compiler import process_settings

    settings = process_settings(config)
    if not settings:
        return
    print(
        "note: the training processes compute these tensor rules' inputs; start them with "
        f"TRAINPROF_RULES_CONFIG={source or 'FILE'} (trainprof.start() and "
        "trainprof.torch.watch() read it), or the rules find none of their series "
        "(TrainprofRuleInputMissing):",
        file=sys.stderr,
    )
    for line in settings:
        print(f"  {line}", file=sys.stderr)


def _print_catalog() -> None:
    from trainprof.rules.catalog import registry

    for spec in registry.CATALOG:
        params = ", ".join(f"{p.name}={p.default}" for p in spec.params)
        print(f"{spec.name:<24} {spec.severity:<8} {spec.summary}")
        print(f"{'':<24} {params}")


def _print_resolved(config: RulesConfig) -> None:
    print(
        f"datapoint_interval {config.datapoint_interval:g}s, scrape_interval "
        f"{config.scrape_interval:g}s, patience_mode {config.patience_mode}"
    )
    for instance in config.rules:
        values = ", ".join(f"{k}={v}" for k, v in instance.values.items() if v is not None)
        patience = instance.patience_mode if "patience" in instance.values else "-"
        print(f"{instance.spec.name:<24} {instance.severity:<8} patience {patience:<6} {values}")
    print(f"ok: {len(config.rules)} rules")

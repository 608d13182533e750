"""`trainprof replay`: which rules would have fired on a recorded job, and when.

Output: a table for people, the documented JSON for scripts.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from typing import IO, TYPE_CHECKING

from trainprof.cliargs import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    add_choice_argument,
    add_json_argument,
    duration,
    source_setting,
)

if TYPE_CHECKING:
    from trainprof.cliargs import Subparsers
    from trainprof.replay import ReplayResult
    from trainprof.replay.tensors import TrialReplay


def add_parser(commands: Subparsers) -> argparse.ArgumentParser:
    replay = commands.add_parser(
        "replay", help="which rules would have fired on a recorded job, and when"
    )
    replay.set_defaults(run=run)
    replay.add_argument(
        "source",
        metavar="SOURCE",
        help="SageMaker Debugger profiler output directory, a SageMaker Debugger tensor "
        "trial (debug-output/, with events/), or a trainprof recording (.jsonl[.gz] file "
        "or a directory of them)",
    )
    replay.add_argument(
        "--rules",
        metavar="FILE",
        help="rule configuration, as for `rules compile` (default: ProfilerReport with "
        "SageMaker's defaults; for a tensor trial, every tensor rule with its defaults)",
    )
    replay.add_argument(
        "--scrape-interval",
        type=duration,
        default=15.0,
        metavar="DURATION",
        help="scrape interval to replay at (default: 15s)",
    )
    replay.add_argument(
        "--datapoint-interval",
        type=duration,
        metavar="DURATION",
        help="what one datapoint lasts (default: the recording's sampling interval)",
    )
    add_choice_argument(
        replay,
        "--format",
        ("auto", "sagemaker", "trainprof"),
        "what SOURCE is: SageMaker profiler output (system/incremental, "
        "framework/pevents), a trainprof recording (.jsonl[.gz]), or auto: a file is a "
        "recording, a folder is searched for SageMaker output at any depth, else for "
        "recordings",
    )
    replay.add_argument(
        "--job",
        metavar="NAME",
        help="training_job label of the replayed series (default: the SageMaker job folder's name)",
    )
    replay.add_argument(
        "--source",
        dest="sources",
        type=source_setting,
        metavar="SOURCES",
        help="the exporters the rules read: trainprof, dcgm, node_exporter, or a "
        "comma-separated combination (default: the rule configuration's source, trainprof); "
        "dcgm-exporter's and node_exporter's series are synthesised from the recording",
    )
    replay.add_argument(
        "--collect-interval",
        type=duration,
        metavar="DURATION",
        help="dcgm-exporter's collection period, a multiple or divisor of the scrape interval "
        "(default: the scrape interval; 30s in common GPU Operator setups); without dcgm in "
        "--source, trainprof's exporter reads its GPUs from that dcgm-exporter "
        "(--collector.gpu.dcgm-exporter)",
    )
    add_json_argument(replay, "the verdicts")
    return replay


def run(args: argparse.Namespace) -> int:
    from trainprof.cliargs import write_json
    from trainprof.engines.promtool import PromtoolError
    from trainprof.replay import ReplayError, ReplayResult, smdebug
    from trainprof.rules.config import ConfigError

    trial = smdebug.looks_like_trial(args.source)
    if trial and (args.sources not in (None, ("trainprof",)) or args.collect_interval is not None):
        print(
            f"error: {args.source} is a tensor trial: its rules read the saved tensors, "
            "not an exporter, so --source and --collect-interval do not apply",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    try:
        result = _replay_trial(args) if trial else _replay(args)
    except (ReplayError, smdebug.TrialError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (PromtoolError, FileNotFoundError) as e:
        print(f"error: the rule engine failed: {e}", file=sys.stderr)
        return EXIT_FAILED
    for note in result.notes:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        failed = write_json(args.json, result.as_json())
        if failed:
            return failed
    if args.json == "-":
        return 0
    if isinstance(result, ReplayResult):
        print_table(result)
    else:
        _print_trial_table(args.source, result)
    return 0


def _replay(args: argparse.Namespace) -> ReplayResult:
    from trainprof.replay import replay

    return replay(
        args.source,
        args.rules,
        scrape_interval=args.scrape_interval,
        datapoint_interval=args.datapoint_interval,
        fmt=args.format,
        training_job=args.job,
        progress=args.json != "-",
        sources=args.sources,
        collect_interval=args.collect_interval,
    )


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


def print_table(result: ReplayResult, out: IO[str] | None = None) -> None:
    from trainprof.rules.status import measured_text

    out = out or sys.stdout
    minutes = (result.end - result.start) / 60
    print(
        f"Replayed {result.source} (training_job {result.training_job})\n"
        f"  {result.nodes} node(s), {result.gpus} GPU(s), "
        f"{result.samples} samples, {result.steps} steps over {minutes:.1f} min from "
        f"{_when(result.start)} UTC; "
        f"datapoint {result.datapoint_interval:g}s, scraped every "
        f"{result.scrape_interval:g}s, rules evaluated every "
        f"{result.evaluation_interval:g}s" + _sources_line(result) + "\n",
        file=out,
    )
    print(
        f"  {'rule':<24} {'status':<15} {'first fired (UTC)':<20} {'alerts':>6} "
        f"{'datapoints':>10}  measured vs threshold",
        file=out,
    )
    for name, verdict in result.rules.items():
        status = verdict.status
        print(
            f"  {name:<24} {(status.status if status else '-'):<15} "
            f"{_when(verdict.first_fired_at):<20} {len(verdict.alerts):>6} "
            f"{_count(status.datapoints if status else None):>10}  "
            f"{measured_text(status.measure if status else None)}",
            file=out,
        )
    for alert in result.health:
        print(
            f"\n  health: {alert.labels.get('alertname')} ({alert.labels.get('affects')}) "
            f"at {_when(alert.fired_at)}",
            file=out,
        )


def _sources_line(result: ReplayResult) -> str:
    """The exporters replayed, when not trainprof's alone (whose header stays as it was)."""
    sources = result.config.source
    collecting = f"collecting every {result.collect_interval or result.scrape_interval:g}s"
    if "dcgm" not in sources and result.collect_interval is not None:
        held = f"\n  GPUs: trainprof's exporter reading dcgm-exporter ({collecting})"
    else:
        held = ""
    if sources == ("trainprof",):
        return held
    named = [f"dcgm-exporter ({collecting})" if s == "dcgm" else s for s in sources]
    return (
        "\n  sources: "
        + ", ".join(named)
        + " (their series synthesised from the recording); alerts evaluated at their "
        "groups' own interval" + held
    )


def _replay_trial(args: argparse.Namespace) -> TrialReplay:
    """A SageMaker Debugger tensor trial: the tensor rules, with `first_fired_step`."""
    from trainprof.replay.tensors import replay_trial
    from trainprof.rules.files import read_config
    from trainprof.rules.tensors import default_tensor_config

    config = read_config(args.rules) if args.rules else default_tensor_config()
    return replay_trial(args.source, config, training_job=args.job)


def _print_trial_table(source: str, result: TrialReplay) -> None:
    steps = result.steps
    print(
        f"Replayed the tensor trial {source}\n  {len(steps)} saved steps"
        + (f" ({steps[0]} to {steps[-1]})" if steps else "")
        + "\n"
    )
    print(f"  {'rule':<28} {'status':<8} {'first fired at step':<20} {'datapoints':>10}")
    for name, verdict in result.rules.items():
        first = verdict.first_fired_step
        print(
            f"  {name:<28} {verdict.status:<8} {'-' if first is None else first!s:<20} "
            f"{_count(verdict.datapoints):>10}"
        )
    for name, verdict in result.rules.items():
        if verdict.reason:
            print(f"\n  {name}: no data: {verdict.reason}")

"""`trainprof compare`: two runs (or traces) side by side, or SageMaker's verdicts beside
trainprof's.

    trainprof compare A B [-o compare.html] [--json FILE|-]
    trainprof compare JOB_A JOB_B --prometheus URL [--run-a N] [--run-b N]
    trainprof compare --sagemaker JOB_DIR [-o FILE] [--json FILE|-]

A and B are two of a kind: SageMaker profiler output, trainprof recordings or smdebug tensor
trials (each replayed as `trainprof replay` does), two Kineto traces (.json, .json.gz), or,
with --prometheus, two training jobs (the same name twice: two runs of it, the previous
and the latest unless --run-a/--run-b say which).

Exit codes: 0 compared, 1 something it needed failed (Prometheus, promtool, a file not
writable), 2 bad input (what and where said in one line).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import TYPE_CHECKING

from trainprof.cliargs import (
    EXIT_BAD_INPUT,
    add_json_argument,
    add_source_argument,
    duration,
)
from trainprof.compare.runs import CompareError
from trainprof.engines.prometheus_api import add_access_arguments

if TYPE_CHECKING:
    from trainprof.cliargs import Subparsers
    from trainprof.compare.runs import Comparison

LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
RESERVED_LABELS = ("sagemaker", "trainprof")


def add_parser(commands: Subparsers) -> argparse.ArgumentParser:
    compare = commands.add_parser(
        "compare",
        help="what changed between two runs or traces; SageMaker's verdicts beside trainprof's",
        description="Compare two runs of a kind (SageMaker profiler output, trainprof "
        "recordings, tensor trials, Kineto traces, or two jobs in Prometheus) side by side, "
        "or show a SageMaker job's own ProfilerReport verdicts beside trainprof's replay.",
    )
    compare.set_defaults(run=run)
    compare.add_argument(
        "inputs",
        nargs="*",
        metavar="A B",
        help="the two runs: paths (replay sources or traces), or job names with --prometheus",
    )
    compare.add_argument(
        "--sagemaker",
        metavar="JOB_DIR",
        help="a SageMaker job folder holding ProfilerReport/profiler-output/profiler-reports/"
        "*.json: SageMaker's verdicts beside trainprof's replay of the folder's raw profiler "
        "data (or alone, marked so, when it holds none)",
    )
    compare.add_argument(
        "--labels",
        metavar="A,B",
        default="A,B",
        help="what to call the two runs in the report and the JSON (default: A,B)",
    )
    compare.add_argument(
        "--prometheus",
        metavar="URL",
        help="Prometheus (or a compatible API) holding both jobs; A and B are then job names",
    )
    compare.add_argument("--namespace", metavar="NAME", help="namespace of the jobs, if any")
    for side in ("a", "b"):
        compare.add_argument(
            f"--run-{side}",
            metavar="N|TIME",
            help=f"with --prometheus, which run of {side.upper()}'s job name (its number or "
            "start time, as the report's note lists them); default: the latest, or the "
            "previous one for A when A and B name the same job",
        )
    compare.add_argument(
        "--rules",
        metavar="FILE",
        help="rule configuration (default: ProfilerReport with SageMaker's defaults; with "
        "--sagemaker, the parameters SageMaker ran with)",
    )
    compare.add_argument(
        "--scrape-interval",
        type=duration,
        metavar="DURATION",
        help="replay: the scrape interval to replay at (default 15s); Prometheus: the "
        "server's (default: the configuration's)",
    )
    add_source_argument(compare)
    compare.add_argument(
        "--include-last-step",
        action="store_true",
        help="traces: keep the last profiler step, which Holistic Trace Analysis (and "
        "trainprof by default) leaves out because the profiler usually cuts it short",
    )
    add_access_arguments(compare)
    compare.add_argument(
        "--prometheus-timeout",
        type=duration,
        default=60.0,
        metavar="DURATION",
        help="how long each request to Prometheus may take in all (default: 1m)",
    )
    compare.add_argument(
        "-o", "--output", metavar="FILE", help="write the HTML compare report to FILE (- stdout)"
    )
    add_json_argument(compare, "the comparison")
    return compare


def run(args: argparse.Namespace) -> int:
    from trainprof.contract.httpget import secrets
    from trainprof.engines.prometheus_api import PrometheusAPIError, access_from_args
    from trainprof.engines.promtool import PromtoolError
    from trainprof.replay import ReplayError
    from trainprof.replay.smdebug import TrialError
    from trainprof.report import ReportError
    from trainprof.report.cli import data_failed, print_notes
    from trainprof.rules.config import ConfigError
    from trainprof.trace.load import TraceError

    hidden: list[str] = []
    try:
        if args.prometheus is not None:
            access = access_from_args(args)
            hidden = secrets(access.headers)
        else:
            access = None
        comparison = _compare(args, access)
    except (CompareError, ReplayError, ConfigError, TraceError, TrialError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ReportError, PrometheusAPIError, PromtoolError, FileNotFoundError) as e:
        return data_failed(e, hidden)
    print_notes(comparison.doc.get("notes", []), hidden)
    return _write(args, comparison)


def _write(args: argparse.Namespace, comparison: Comparison) -> int:
    from trainprof.cliargs import write_json, write_output
    from trainprof.compare import page, table

    if args.output:
        text = page.render(comparison)
        failed = write_output(args.output, text)
        if failed:
            return failed
        if args.output != "-":
            print(f"wrote {args.output} ({len(text) // 1024} KiB)", file=sys.stderr)
    if args.json:
        failed = write_json(args.json, comparison.doc)
        if failed:
            return failed
    if "-" not in (args.json, args.output):
        sys.stdout.write(table.render(comparison.doc))
    return 0


def labels(text: str) -> tuple[str, str]:
    """The two run labels of --labels A,B: distinct, each a short name.

    >>> labels("before,after")
    ('before', 'after')
    >>> labels("x")
    Traceback (most recent call last):
    ...
    trainprof.compare.runs.CompareError: --labels 'x': give two labels, A,B
    """
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2:
        raise CompareError(f"--labels {text!r}: give two labels, A,B")
    for part in parts:
        if not LABEL.match(part):
            raise CompareError(
                f"--labels {text!r}: {part!r} is not a label (letters, digits, '_', '.', '-'; "
                "at most 64, starting with a letter or digit)"
            )
    if parts[0] == parts[1]:
        raise CompareError(f"--labels {text!r}: the two labels must differ")
    return parts[0], parts[1]


def _compare(args: argparse.Namespace, access) -> Comparison:
    if args.sagemaker is not None:
        if args.inputs:
            raise CompareError("--sagemaker JOB_DIR takes no A B: it compares one job's verdicts")
        from trainprof.compare.sagemaker import compare_sagemaker

        return compare_sagemaker(
            args.sagemaker,
            args.rules,
            scrape_interval=args.scrape_interval or 15.0,
            sources=args.source,
        )
    if len(args.inputs) != 2:
        raise CompareError(
            f"give two runs to compare, A and B (got {len(args.inputs)}), or --sagemaker JOB_DIR"
        )
    label_a, label_b = labels(args.labels)
    a, b = args.inputs
    if args.prometheus is not None:
        return _from_prometheus(args, access, (label_a, a), (label_b, b))
    kinds = [_kind(path) for path in (a, b)]
    if kinds[0] != kinds[1]:
        raise CompareError(
            f"A ({a}) is {kinds[0]} and B ({b}) is {kinds[1]}: compare two of a kind"
        )
    if kinds[0] == "a Kineto trace":
        from trainprof.compare.traces import compare_traces

        return compare_traces(a, b, (label_a, label_b), args.include_last_step)
    return _from_replays(args, (label_a, a), (label_b, b))


def _kind(path: str) -> str:
    from trainprof.replay import smdebug

    if not os.path.exists(path):
        raise CompareError(f"{path}: no such file or folder")
    if os.path.isdir(path):
        return "a tensor trial" if smdebug.looks_like_trial(path) else "a replay source"
    name = os.path.basename(path).lower()
    if name.endswith((".json", ".json.gz")):
        return "a Kineto trace"
    return "a replay source"


def _from_replays(args, *sides: tuple[str, str]) -> Comparison:
    from trainprof.compare.figures import figures
    from trainprof.compare.queries import compare_queries
    from trainprof.compare.runs import compare_runs
    from trainprof.replay import smdebug
    from trainprof.report import from_replay, from_trial

    found = []
    for label, path in sides:
        if smdebug.looks_like_trial(path):
            collected = from_trial(path, args.rules)
        else:
            collected = from_replay(
                path,
                args.rules,
                scrape_interval=args.scrape_interval or 15.0,
                sources=args.source,
                extra=compare_queries,
            )
        found.append(figures(label, collected))
    return compare_runs(found[0], found[1])


def _from_prometheus(args, access, *sides: tuple[str, str]) -> Comparison:
    from trainprof.compare.figures import figures
    from trainprof.compare.queries import compare_queries
    from trainprof.compare.runs import compare_runs
    from trainprof.report import from_prometheus
    from trainprof.rules.files import read_config

    config = read_config(args.rules, scrape_interval=args.scrape_interval, source=args.source)
    (label_a, job_a), (label_b, job_b) = sides
    runs = [args.run_a, args.run_b]
    if job_a == job_b and runs[0] is None:
        runs[0] = _previous_run(args, access, config, job_a, runs[1])
    found = []
    for (label, job), run in zip(sides, runs):
        collected = from_prometheus(
            args.prometheus,
            job,
            config,
            namespace=args.namespace,
            access=access,
            run=run,
            timeout=args.prometheus_timeout,
            extra=compare_queries,
        )
        found.append(figures(label, collected))
    if job_a == job_b and found[0].start == found[1].start:
        raise CompareError(
            f"A and B are the same run of {job_a}: give --run-a and --run-b (two runs of the "
            "job name), or two job names"
        )
    return compare_runs(found[0], found[1])


def _previous_run(args, access, config, job: str, later: str | None) -> str:
    """The run before B's (the latest, or --run-b) of a job name compared with itself."""
    import time

    from trainprof.engines.prometheus_api import PrometheusAPI
    from trainprof.report.collect import _extreme, _presence, find_runs, pick_run

    api = PrometheusAPI(args.prometheus, timeout=args.prometheus_timeout, access=access)
    now = time.time()
    # Where the job was seen in the last week, so runs are looked for at a step that short
    # runs do not fall between.
    presence = _presence(job, args.namespace, config.source)
    first = _extreme(api, "min", presence, 7 * 86400, now)
    last = _extreme(api, "max", presence, 7 * 86400, now)
    runs = find_runs(api, job, args.namespace, first, last) if first and last else []
    if len(runs) < 2:
        raise CompareError(
            f"{job} has {len(runs)} run(s) in the last week that trainprof can tell apart "
            "(by trainprof_training_start_timestamp_seconds): nothing to compare it with; "
            "give two job names"
        )
    index = pick_run(runs, later)
    if index == 0:
        raise CompareError(f"--run-b {later}: the first run of {job} has none before it")
    return str(index)  # pick_run numbers runs from 1: the one before B's

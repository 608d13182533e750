"""`trainprof report`: arguments in, one HTML file out; errors as sentences, never a traceback.

Exit codes: 0 written, 1 something the report needed failed (Prometheus unreachable, promtool
missing, the file not writable), 2 bad input (a source or job that does not exist, a bad
configuration or time).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from trainprof.cliargs import EXIT_BAD_INPUT, EXIT_FAILED, add_source_argument, duration
from trainprof.engines.prometheus_api import add_access_arguments
from trainprof.trace.cli import add_window_argument

if TYPE_CHECKING:
    from trainprof.cliargs import Subparsers
    from trainprof.engines.prometheus_api import Access
    from trainprof.report.collect import Collected


def add_parser(commands: Subparsers) -> argparse.ArgumentParser:
    report = commands.add_parser(
        "report",
        help="a self-contained HTML profiling report of one job",
        description="Write SageMaker's profiling report (training job summary, system usage, "
        "framework metrics, rules summary, the rules that fired) for one job, as "
        "a single HTML file that needs no network to view.",
    )
    report.set_defaults(run=run)
    source = report.add_mutually_exclusive_group()
    source.add_argument(
        "--prometheus",
        metavar="URL",
        help="Prometheus (or a compatible API) holding the job's series and "
        "the compiled rules' ALERTS",
    )
    source.add_argument(
        "--replay",
        metavar="SOURCE",
        help="SageMaker profiler output, a SageMaker Debugger tensor trial (debug-output/: "
        "its tensor rules, default all with SageMaker's defaults) or a trainprof recording, "
        "replayed through the rules as `trainprof replay` does",
    )
    report.add_argument(
        "--job",
        metavar="NAME",
        help="training_job to report on (required with --prometheus; with "
        "--replay, the name to give the replayed job)",
    )
    report.add_argument("--namespace", metavar="NAME", help="namespace of the job, if any")
    report.add_argument(
        "--run",
        dest="job_run",  # args.run is the sub-command's entry point
        metavar="N|TIME",
        help="with --prometheus, which run of a job name used more than once (a "
        "resubmitted job): its number as the report's note lists them, or its start time "
        "(default: the latest)",
    )
    report.add_argument(
        "--from",
        dest="start",
        metavar="TIME",
        help="start: now-6h, Unix seconds or RFC 3339 (default: the job's "
        "first sample in the last week)",
    )
    report.add_argument(
        "--to", dest="end", metavar="TIME", help="end (default: the job's last sample)"
    )
    report.add_argument(
        "--rules",
        metavar="FILE",
        help="rule configuration the job was watched with (default: with --prometheus, the "
        "trainprof rules it evaluates, from its /api/v1/rules; otherwise ProfilerReport with "
        "SageMaker's defaults)",
    )
    report.add_argument(
        "--scrape-interval",
        type=duration,
        metavar="DURATION",
        help="scrape interval (replay: to replay at, default 15s; "
        "Prometheus: the server's, default the configuration's)",
    )
    add_source_argument(report)
    add_access_arguments(report)
    report.add_argument(
        "--prometheus-timeout",
        type=duration,
        default=60.0,
        metavar="DURATION",
        help="how long each request to Prometheus may take in all, answer included (default: 1m)",
    )
    report.add_argument(
        "--trace",
        nargs="+",
        action="extend",
        default=[],
        metavar="TRACE",
        help="PyTorch profiler (Kineto) traces, one per rank (.json or .json.gz): adds the "
        "GPU kernels section; alone, the report has only that section",
    )
    add_window_argument(report)
    report.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="HTML file to write, or - for stdout"
    )
    return report


def data_failed(e: Exception, hidden: Sequence[str]) -> int:
    """Say on stderr why the data for a report could not be had, with the secrets in `hidden`
    masked; the exit status: 2 where the input was at fault, else 1."""
    from trainprof.contract.httpget import redact
    from trainprof.engines.prometheus_api import PrometheusAPIError
    from trainprof.report import ReportError

    if isinstance(e, (ReportError, PrometheusAPIError)):
        print(f"error: {redact(str(e), hidden)}", file=sys.stderr)
        return EXIT_BAD_INPUT if e.bad_input else EXIT_FAILED
    print(f"error: the rule engine failed: {e}", file=sys.stderr)
    return EXIT_FAILED


def print_notes(notes: Iterable[str], hidden: Sequence[str]) -> None:
    """Each note on stderr, with the secrets in `hidden` masked."""
    from trainprof.contract.httpget import redact

    for note in notes:
        print(f"note: {redact(note, hidden)}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from trainprof.contract.httpget import secrets
    from trainprof.engines.prometheus_api import PrometheusAPIError, access_from_args
    from trainprof.engines.promtool import PromtoolError
    from trainprof.replay import ReplayError, smdebug
    from trainprof.report import ReportError, build, from_replay, from_trial, render
    from trainprof.rules.config import ConfigError

    if args.replay is None and args.prometheus is None and not args.trace:
        print("error: give --prometheus URL, --replay SOURCE or --trace TRACE...", file=sys.stderr)
        return EXIT_BAD_INPUT
    kernels, trace_errors = _kernel_section(args.trace, args.include_last_step)
    for error in trace_errors:
        print(f"error: {error} (skipped)", file=sys.stderr)
    if args.trace and kernels is None:
        return EXIT_BAD_INPUT
    if args.replay is None and args.prometheus is None:
        text = render(_trace_only_report(args, kernels))
        return _write(args, text, "GPU kernels only", EXIT_BAD_INPUT if trace_errors else 0)
    hidden: list[str] = []  # the access' secrets: no message shows them, whoever wrote it
    try:
        if args.replay is not None and smdebug.looks_like_trial(args.replay):
            collected = from_trial(args.replay, args.rules, training_job=args.job)
        elif args.replay is not None:
            collected = from_replay(
                args.replay,
                args.rules,
                scrape_interval=args.scrape_interval or 15.0,
                training_job=args.job,
                sources=args.source,
            )
        else:
            access = access_from_args(args)
            hidden = secrets(access.headers)
            collected = _from_prometheus(args, access)
    except (ReplayError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ReportError, PrometheusAPIError, PromtoolError, FileNotFoundError) as e:
        return data_failed(e, hidden)
    print_notes(collected.notes, hidden)
    report = build(collected)
    if kernels is not None:
        report.sections.insert(len(report.sections) - 1, kernels)
    fired = sum(1 for v in collected.verdicts.values() if v.fired)
    return _write(
        args,
        render(report),
        f"{collected.training_job}, {fired} of {len(collected.verdicts)} rules fired",
        EXIT_BAD_INPUT if trace_errors else 0,
    )


def _write(args: argparse.Namespace, text: str, what: str, code: int) -> int:
    from trainprof.cliargs import write_output

    failed = write_output(args.output, text)
    if failed:
        return failed
    if args.output != "-":
        print(f"wrote {args.output} ({len(text) // 1024} KiB): {what}", file=sys.stderr)
    return code


def _kernel_section(paths: list[str], include_last_step: bool = False):
    """The GPU kernels section from the readable traces (None if none), and the errors."""
    if not paths:
        return None, []
    from trainprof.report.kernels import kernel_section
    from trainprof.trace.cli import load_traces
    from trainprof.trace.summary import summarize_all

    traces, errors = load_traces(paths)
    if not traces:
        return None, errors
    notes = [f"Skipped unreadable trace: {e}." for e in errors]
    summary = summarize_all(traces, include_last_step=include_last_step)
    return kernel_section(summary["ranks"], notes), errors


def _trace_only_report(args: argparse.Namespace, kernels):
    import os

    from trainprof import __version__
    from trainprof.report.build import Report

    end = max(os.path.getmtime(p) for p in args.trace if os.path.exists(p))
    return Report(
        training_job=args.job or os.path.basename(args.trace[0]),
        source="PyTorch profiler traces",
        start=end,
        end=end,
        generator=f"trainprof {__version__}",
        sections=[kernels],
        rules=[],
        timeline=None,
        details=[],
        notes=[],
    )


def _from_prometheus(args: argparse.Namespace, access: Access) -> Collected:
    from trainprof.report import ReportError, from_prometheus
    from trainprof.report.collect import parse_time
    from trainprof.rules.files import read_config

    if not args.job:
        raise ReportError("--job is required with --prometheus (the training_job label)")
    now = time.time()
    try:
        start = parse_time(args.start, now) if args.start else None
        end = parse_time(args.end, now) if args.end else None
    except ValueError as e:
        raise ReportError(f"--from/--to: {e}") from None
    config = read_config(args.rules, scrape_interval=args.scrape_interval, source=args.source)
    return from_prometheus(
        args.prometheus,
        args.job,
        config,
        start=start,
        end=end,
        namespace=args.namespace,
        now=now,
        access=access,
        run=args.job_run,
        timeout=args.prometheus_timeout,
        loaded=args.rules is None,
    )

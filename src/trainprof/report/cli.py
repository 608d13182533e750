"""`trainprof report`: arguments in, one HTML file out; errors as sentences, never a traceback.

Exit codes: 0 written, 1 something the report needed failed (Prometheus unreachable, promtool
missing, the file not writable), 2 bad input (a source or job that does not exist, a bad
configuration or time).
"""

from __future__ import annotations

import argparse
import sys
import time

from trainprof.names import EXIT_BAD_INPUT, EXIT_FAILED


def add_parser(commands) -> argparse.ArgumentParser:
    from trainprof.cli import _duration

    report = commands.add_parser(
        "report",
        help="a self-contained HTML profiling report of one job",
        description="Write SageMaker's profiling report (training job summary, system usage, "
        "framework metrics, rules summary, the rules that fired) for one job, as "
        "a single HTML file that needs no network to view.",
    )
    source = report.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--prometheus",
        metavar="URL",
        help="Prometheus (or a compatible API) holding the job's series and "
        "the compiled rules' ALERTS",
    )
    source.add_argument(
        "--replay",
        metavar="SOURCE",
        help="SageMaker profiler output or a trainprof recording, replayed "
        "through the rules as `trainprof replay` does",
    )
    report.add_argument(
        "--job",
        metavar="NAME",
        help="training_job to report on (required with --prometheus; with "
        "--replay, the name to give the replayed job)",
    )
    report.add_argument("--namespace", metavar="NAME", help="namespace of the job, if any")
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
        help="rule configuration the job was watched with (default: "
        "ProfilerReport with SageMaker's defaults)",
    )
    report.add_argument(
        "--scrape-interval",
        type=_duration,
        metavar="DURATION",
        help="scrape interval (replay: to replay at, default 15s; "
        "Prometheus: the server's, default the configuration's)",
    )
    report.add_argument(
        "-o", "--output", required=True, metavar="FILE", help="HTML file to write, or - for stdout"
    )
    return report


def main(args: argparse.Namespace) -> int:
    from trainprof.promtool import PromtoolError
    from trainprof.replay import ReplayError
    from trainprof.report import ReportError, build, from_prometheus, from_replay, render
    from trainprof.rules.config import ConfigError

    try:
        if args.replay is not None:
            collected = from_replay(
                args.replay,
                args.rules,
                scrape_interval=args.scrape_interval or 15.0,
                training_job=args.job,
            )
        else:
            collected = _from_prometheus(args, from_prometheus)
    except (ReplayError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT if e.bad_input else EXIT_FAILED
    except (PromtoolError, FileNotFoundError) as e:
        print(f"error: the rule engine failed: {e}", file=sys.stderr)
        return EXIT_FAILED
    for note in collected.notes:
        print(f"note: {note}", file=sys.stderr)
    text = render(build(collected))
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    try:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        print(f"error: cannot write {args.output}: {e.strerror or e}", file=sys.stderr)
        return EXIT_FAILED
    fired = sum(1 for v in collected.verdicts.values() if v.fired)
    print(
        f"wrote {args.output} ({len(text) // 1024} KiB): {collected.training_job}, "
        f"{fired} of {len(collected.verdicts)} rules fired",
        file=sys.stderr,
    )
    return 0


def _from_prometheus(args, from_prometheus):
    from trainprof.report import ReportError
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
    config = read_config(args.rules, scrape_interval=args.scrape_interval)
    return from_prometheus(
        args.prometheus, args.job, config, start=start, end=end, namespace=args.namespace, now=now
    )

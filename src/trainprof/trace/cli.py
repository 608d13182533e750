"""`trainprof trace summarize TRACE... [--json FILE|-] [--top N] [--include-last-step]`.

Each TRACE is one rank's Kineto trace (.json or .json.gz). A file that cannot be read is
reported on stderr and skipped; the others are still summarized, and the exit code is 2.
The last profiler step is left out unless `--include-last-step` (`trainprof.trace.window`).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from trainprof.cliargs import EXIT_BAD_INPUT, add_json_argument, write_json

if TYPE_CHECKING:
    from trainprof.cliargs import Subparsers


def add_parser(commands: Subparsers) -> argparse.ArgumentParser:
    trace = commands.add_parser(
        "trace", help="kernel-level summaries of PyTorch profiler (Kineto) traces"
    )
    trace.set_defaults(run=run)
    sub = trace.add_subparsers(dest="trace_command", metavar="SUBCOMMAND", required=True)
    summarize = sub.add_parser(
        "summarize",
        help="GPU time by overlap class, idle time, top kernels, precision, activities",
        description="Summarize Kineto traces, one per rank (rank from distributedInfo, else 0).",
    )
    summarize.add_argument("traces", nargs="+", metavar="TRACE", help=".json or .json.gz")
    add_json_argument(summarize, "the summary")
    summarize.add_argument(
        "--top", type=int, default=15, metavar="N", help="kernels to list (default: 15)"
    )
    add_window_argument(summarize)
    return trace


def add_window_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--include-last-step",
        action="store_true",
        help="summarize the last profiler step too (default: left out, as Holistic Trace "
        "Analysis does, because the profiler usually stops in the middle of it)",
    )


def load_traces(paths: list[str]) -> tuple[list, list[str]]:
    """Read every trace; return the good ones (distinct ranks) and one error line per bad one."""
    from trainprof.trace.load import TraceError, read_trace

    traces: list = []
    errors: list[str] = []
    seen: dict[int, str] = {}
    for path in paths:
        try:
            trace = read_trace(path)
        except TraceError as e:
            errors.append(str(e))
            continue
        if trace.rank in seen:
            errors.append(
                f"{path}: rank {trace.rank} again (already read from {seen[trace.rank]}); "
                "give one trace per rank"
            )
            continue
        seen[trace.rank] = path
        if trace.skipped:
            print(f"warning: {path}: skipped {trace.skipped} malformed events", file=sys.stderr)
        traces.append(trace)
    return traces, errors


def run(args: argparse.Namespace) -> int:
    from trainprof.trace.summary import summarize_all

    if args.top < 1:
        print("error: --top must be at least 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    traces, errors = load_traces(args.traces)
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    if not traces:
        return EXIT_BAD_INPUT
    summary = summarize_all(traces, args.top, args.include_last_step)
    if args.json:
        failed = write_json(args.json, summary)
        if failed:
            return failed
    else:
        paths = {str(t.rank): t.path for t in traces}
        for rank, s in summary["ranks"].items():
            sys.stdout.write(render_text(rank, paths[rank], s))
    return EXIT_BAD_INPUT if errors else 0


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def render_text(rank: str, path: str, s: dict[str, Any]) -> str:
    from trainprof.trace.window import describe

    span, idle = s["span_seconds"], s["idle_seconds"]
    busy = span - idle
    share = f" ({100 * busy / span:.1f} %)" if span else ""
    lines = [f"rank {rank}  {path}  {s['gpu'].get('name', 'unknown GPU')}"]
    lines.append(f"  window: {describe(s['window'])}")
    if not span:
        lines.append("  no GPU activity in this window (kernels, memcpy, memset)")
    lines.append(f"  span {_ms(span)}, GPU busy {_ms(busy)}{share}, idle {_ms(idle)}")
    for title, key in (
        ("busy by class", "gpu_time_seconds"),
        ("activity", "activity_seconds"),
        ("precision", "precision_seconds"),
    ):
        if s[key]:
            parts = ", ".join(f"{k} {_ms(v)}" for k, v in s[key].items())
            lines.append(f"  {title}: {parts}")
    latency = s["launch_latency_seconds"]
    if latency.get("count"):
        lines.append(
            f"  launch latency: p50 {latency['p50'] * 1e6:.1f} us, p95 "
            f"{latency['p95'] * 1e6:.1f} us over {latency['count']} launches"
        )
    if s["top_kernels"]:
        lines.append("  top kernels by time:")
        for k in s["top_kernels"]:
            lines.append(f"    {_ms(k['seconds']):>12} {k['launches']:>6}x  {k['name'][:100]}")
    return "\n".join(lines) + "\n\n"

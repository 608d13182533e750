"""Which part of a trace a summary covers: Holistic Trace Analysis' window by default.

`torch.profiler` usually stops in the middle of its last step, so that step is cut short.
HTA (`TraceAnalysis(include_last_profiler_step=False)`, its default) therefore leaves it out,
and trainprof does the same, so that both report the same span, idle time and classes:

- with fewer than two `ProfilerStep#N` ranges there is nothing to window by: the whole trace;
- otherwise a GPU event counts when the host call that launched it (`cuda_runtime`,
  `cuda_driver`, paired by `correlation`) started before the last step began; with
  `include_last_step`, when it started no later than the last step's end. A GPU event whose
  launch is not in the trace cannot be placed in a step and is left out, as HTA does;
- host events (operators, annotations, steps, syncs) count by their own start, the same way.

    >>> from trainprof.trace import read_trace
    >>> traces = "tests/data/real-gpu-traces/"
    >>> _, w = windowed(read_trace(traces + "a100-nccl-training.pt.trace.json.gz"), False)
    >>> w["steps"], w["left_out_step"], w["device_events"], w["device_events_left_out"]
    (['ProfilerStep#4', 'ProfilerStep#5'], 'ProfilerStep#6', 2516, 1258)
    >>> _, w = windowed(read_trace(traces + "a100-alexnet.pt.trace.json.gz"), False)
    >>> w["rule"]
    'the whole trace (no two ProfilerStep#N ranges to window by)'

HTA also takes a `gpu_user_annotation` named `ProfilerStep#N` (ROCm writes them) as a step
when it looks for the last one; trainprof takes the host's ranges only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainprof.trace.load import Span, Trace

STEP_MARK = "ProfilerStep"


def profiler_steps(trace: Trace) -> list[Span]:
    """The host's `ProfilerStep#N` ranges (user annotations; cpu_op in old traces), by start."""
    found = [s for s in (*trace.annotations, *trace.cpu_ops) if STEP_MARK in s.name]
    return sorted(found, key=lambda s: (s.start, s.name))


def windowed(trace: Trace, include_last_step: bool) -> tuple[Trace, dict[str, Any]]:
    """The trace cut to its window, and what the window was (the summary's `window`)."""
    steps = profiler_steps(trace)
    names = {s.name for s in steps}
    window: dict[str, Any] = {
        "include_last_step": include_last_step,
        "profiler_steps": len(names),
        "steps": sorted(names, key=_step_order),
        "left_out_step": None,
        "device_events": len(trace.device),
        "device_events_left_out": 0,
        "device_events_without_launch": 0,
    }
    if len(names) < 2:
        window["rule"] = "the whole trace (no two ProfilerStep#N ranges to window by)"
        return trace, window
    last = max(steps, key=lambda s: s.start)
    last_end = max(s.end for s in steps)
    if include_last_step:

        def inside(start: int) -> bool:
            return start <= last_end

        window["rule"] = "GPU work launched up to the end of the last profiler step"
    else:

        def inside(start: int) -> bool:
            return start < last.start

        window["left_out_step"] = last.name
        window["steps"] = [n for n in window["steps"] if n != last.name]
        window["rule"] = (
            f"GPU work launched before the last profiler step ({last.name}, usually cut "
            "short when the profiler stopped) began"
        )
    launches = {c: s for c, s in trace.launches.items() if inside(s.start)}
    device = [e for e in trace.device if e.correlation in launches]
    window["device_events"] = len(device)
    window["device_events_left_out"] = len(trace.device) - len(device)
    window["device_events_without_launch"] = sum(
        1 for e in trace.device if e.correlation not in trace.launches
    )
    cut = dataclasses.replace(
        trace,
        device=device,
        launches=launches,
        syncs=[s for s in trace.syncs if inside(s.start)],
        cpu_ops=[s for s in trace.cpu_ops if inside(s.start)],
        annotations=[s for s in trace.annotations if inside(s.start)],
    )
    return cut, window


def _step_order(name: str) -> tuple[int, str]:
    number = name.rsplit("#", 1)[-1]
    return (int(number), name) if number.isdigit() else (-1, name)


def describe(window: dict[str, Any]) -> str:
    """One line for people: what the summary covers.

    >>> from trainprof.trace import read_trace
    >>> traces = "tests/data/real-gpu-traces/"
    >>> _, w = windowed(read_trace(traces + "a100-nccl-training.pt.trace.json.gz"), False)
    >>> print(describe(w))
    ProfilerStep#4..#5: 2 of 3 profiler steps, the last (ProfilerStep#6) left out as HTA does: \
the profiler usually stops inside it (--include-last-step keeps it); 1258 GPU events left out
    """
    steps, count = window["steps"], window["profiler_steps"]
    if count < 2:
        return "the whole trace" + (" (one profiler step: nothing to window by)" if count else "")
    covered = steps[0] if len(steps) == 1 else f"{steps[0]}..#{steps[-1].rsplit('#', 1)[-1]}"
    if window["left_out_step"]:
        text = (
            f"{covered}: {len(steps)} of {count} profiler steps, the last "
            f"({window['left_out_step']}) left out as HTA does: the profiler usually stops "
            "inside it (--include-last-step keeps it)"
        )
    else:
        text = f"{covered}: all {count} profiler steps, the last included (--include-last-step)"
    left_out = window["device_events_left_out"]
    if left_out:
        text += f"; {left_out} GPU events left out"
        unlaunched = window["device_events_without_launch"]
        if unlaunched:
            text += f" ({unlaunched} launched before the trace began, or by no host call in it)"
    return text

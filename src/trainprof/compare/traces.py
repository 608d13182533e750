"""Two Kineto traces diffed as Holistic Trace Analysis does (`hta.trace_diff.TraceDiff`),
with the GPU's time classes beside.

Conventions, HTA's:
- the window is HTA's default one (`trace.window`): the last profiler step, which the
  profiler usually cuts short, is left out (`include_last_step` keeps it);
- kernels (GPU: kernels, memcpy, memset) and operators (CPU: `cpu_op` events) are grouped by
  their name as the trace writes it, with their count and total duration;
- events are counted in the window's profiler steps (`ProfilerStep#N`): a host event in the
  step its start falls in, a GPU event in its launch's step (paired by `correlation`), the
  rest left out, as TraceDiff does given the iterations;
- a name is `added` (only in B), `removed` (only in A; HTA's "deleted"), `increased`,
  `decreased` or `unchanged` by its count.

Runs of different lengths: when both windows hold profiler steps, counts and times are per
step and the changes judged per step (with equal step counts exactly HTA's categories);
without steps, the whole traces are compared and the JSON says so. The time classes are the
trace summary's (`trainprof trace summarize`): compute, communication (NCCL/RCCL), memory
(memcpy, memset), each overlap of them, and idle, over the same window.

    >>> from trainprof.trace import read_trace
    >>> t = read_trace("tests/data/real-gpu-traces/a100-nccl-training.pt.trace.json.gz")
    >>> side = Side.of("A", t, include_last_step=False)
    >>> side.steps, side.kernels["ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, "
    ...                          "unsigned long, ncclWork*)"][0]
    (2, 10)
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict
from fractions import Fraction
from typing import Any

from trainprof.compare.runs import VERSION, Comparison
from trainprof.trace import classify
from trainprof.trace.intervals import exclusive_overlap, merged
from trainprof.trace.load import Trace, read_trace
from trainprof.trace.summary import overlap_class_names
from trainprof.trace.window import describe, profiler_steps, windowed

NS = 1e-9
PER_STEP, WHOLE = "per profiler step", "whole trace"
CHANGES = ("added", "removed", "increased", "decreased", "unchanged")
# A name whose count did not change but whose time moved more than this share of A's (and
# more than a microsecond per step) is flagged `time_changed`.
TIME_CHANGE = 0.05


@dataclasses.dataclass
class Side:
    """One trace, cut to its window: what the diff counts."""

    label: str
    path: str
    rank: int
    gpu: str
    window: str
    steps: int  # profiler steps in the window
    span_ns: int
    classes_ns: dict[str, int]  # compute, communication, ..., idle
    kernels: dict[str, tuple[int, int]]  # name -> (count, ns)
    operators: dict[str, tuple[int, int]]

    @classmethod
    def of(cls, label: str, trace: Trace, include_last_step: bool) -> Side:
        cut, window = windowed(trace, include_last_step)
        # The window's steps (no step: the whole trace is counted).
        steps = sorted(
            {s.name: s for s in profiler_steps(cut)}.values(), key=lambda s: (s.start, s.name)
        )
        starts = [s.start for s in steps]

        def step_of(t: int) -> int | None:
            i = bisect.bisect_right(starts, t) - 1
            return i if i >= 0 and t < steps[i].end else None

        def in_steps(t: int) -> bool:
            return not steps or step_of(t) is not None

        kernels: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for e in cut.device:
            launch = cut.launches.get(e.correlation) if e.correlation is not None else None
            if steps and (launch is None or not in_steps(launch.start)):
                continue
            row = kernels[e.name]
            row[0] += 1
            row[1] += e.end - e.start
        operators: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for op in cut.cpu_ops:
            if in_steps(op.start):
                row = operators[op.name]
                row[0] += 1
                row[1] += op.end - op.start
        span, classes = _classes(cut)
        return cls(
            label,
            trace.path,
            trace.rank,
            _gpu_name(trace),
            describe(window),
            len(steps),
            span,
            classes,
            {k: (v[0], v[1]) for k, v in kernels.items()},
            {k: (v[0], v[1]) for k, v in operators.items()},
        )

    def summary_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "source": self.path,
            "rank": self.rank,
            "gpu": self.gpu,
            "window": self.window,
            "steps": self.steps,
            "span_seconds": round(self.span_ns * NS, 9),
        }


def _gpu_name(trace: Trace) -> str:
    used = {e.device for e in trace.device}
    props = [g for g in trace.gpus if g.get("id") in used] or trace.gpus
    return str(props[0].get("name", "")) if props else ""


def _classes(trace: Trace) -> tuple[int, dict[str, int]]:
    """Span and GPU time by overlap class (exclusive) and idle, in ns, as the summary."""
    events = trace.device
    if not events:
        return 0, {}
    index = {c: i for i, c in enumerate(classify.OVERLAP_CLASSES)}
    by_mask = exclusive_overlap(
        ((e.start, e.end, index[classify.overlap_class(e.name, e.kind)]) for e in events),
        len(index),
    )
    span = max(e.end for e in events) - min(e.start for e in events)
    busy = sum(b - a for a, b in merged((e.start, e.end) for e in events))
    out = {overlap_class_names(mask): ns for mask, ns in sorted(by_mask.items())}
    out["idle"] = span - busy
    return span, out


def compare_traces(
    path_a: str, path_b: str, labels: tuple[str, str] = ("A", "B"), include_last_step=False
) -> Comparison:
    """The diff of trace B against trace A (one rank's trace each)."""
    a = Side.of(labels[0], read_trace(path_a), include_last_step)
    b = Side.of(labels[1], read_trace(path_b), include_last_step)
    return Comparison(diff(a, b), [])


def diff(a: Side, b: Side) -> dict[str, Any]:
    per_step = a.steps > 0 and b.steps > 0
    per = PER_STEP if per_step else WHOLE
    not_comparable = []
    if not per_step:
        missing = [s.label for s in (a, b) if not s.steps]
        not_comparable.append(
            f"per-step figures: {' and '.join(missing)} has no profiler steps to count in "
            "(fewer than two ProfilerStep#N ranges); the whole traces are compared, which "
            "HTA's trace diff (it needs iterations) cannot do"
        )
    if a.steps != b.steps and per_step:
        not_comparable.append(
            f"step counts differ ({a.label}: {a.steps}, {b.label}: {b.steps}): counts and "
            "times are per step, and so are the changes"
        )
    if a.gpu != b.gpu and a.gpu and b.gpu:
        not_comparable.append(f"GPUs differ ({a.label}: {a.gpu}, {b.label}: {b.gpu})")

    def scale(side: Side) -> int:
        return side.steps if per_step else 1

    classes = {}
    for name in sorted(set(a.classes_ns) | set(b.classes_ns), key=_class_order):
        va = a.classes_ns.get(name, 0) * NS / scale(a)
        vb = b.classes_ns.get(name, 0) * NS / scale(b)
        classes[name] = {
            "runs": {a.label: round(va, 9), b.label: round(vb, 9)},
            "change": round(vb - va, 9),
        }
    doc = {
        "version": VERSION,
        "kind": "traces",
        "runs": [a.summary_json(), b.summary_json()],
        "time_classes": {"per": per, "classes": classes},
        "kernels": _names(a, b, "kernels", per_step),
        "operators": _names(a, b, "operators", per_step),
        "rules": {},
        "not_comparable": not_comparable,
        "notes": [],
    }
    return doc


def _class_order(name: str) -> tuple[int, str]:
    order = {"compute": 0, "communication": 1, "memory": 2, "idle": 9}
    return (order.get(name, 5), name)


def _names(a: Side, b: Side, what: str, per_step: bool) -> dict[str, Any]:
    found_a, found_b = getattr(a, what), getattr(b, what)
    sa, sb = (a.steps, b.steps) if per_step else (1, 1)
    entries = []
    for name in set(found_a) | set(found_b):
        ca, ta = found_a.get(name, (0, 0))
        cb, tb = found_b.get(name, (0, 0))
        # Per step, exactly: count_a / steps_a against count_b / steps_b.
        ra, rb = Fraction(ca, sa), Fraction(cb, sb)
        if not ca:
            change = "added"
        elif not cb:
            change = "removed"
        else:
            change = "increased" if rb > ra else "decreased" if rb < ra else "unchanged"
        secs_a, secs_b = ta * NS / sa, tb * NS / sb
        moved = secs_b - secs_a
        entries.append(
            {
                "name": name,
                "change": change,
                "runs": {
                    a.label: _side(ra, secs_a, ca, ta),
                    b.label: _side(rb, secs_b, cb, tb),
                },
                "change_seconds": round(moved, 9),
                "time_changed": abs(moved) > max(TIME_CHANGE * secs_a, 1e-6),
            }
        )
    entries.sort(key=lambda e: (-abs(e["change_seconds"]), e["name"]))
    summary = {c: sum(1 for e in entries if e["change"] == c) for c in CHANGES}
    summary["changed_time"] = sum(
        1 for e in entries if e["change"] == "unchanged" and e["time_changed"]
    )
    return {"per": PER_STEP if per_step else WHOLE, "summary": summary, "entries": entries}


def _side(per: Fraction, seconds: float, total: int, total_ns: int) -> dict[str, Any]:
    """A name's figures in one trace: per step (or whole) and over the whole window."""
    return {
        "count": _count(per),
        "seconds": round(seconds, 9),
        "total": total,
        "total_seconds": round(total_ns * NS, 9),
    }


def _count(x: Fraction) -> float | int:
    return int(x) if x.denominator == 1 else round(float(x), 6)

"""Two runs side by side: what changed between them, as the compare JSON contract says it
(docs/compare.md, schemas/trainprof-compare.schema.json).

A change is the second run (B) minus the first (A). A step-time change is *beyond the runs'
own noise* when it is larger than the two runs' noise together, each run's noise being half
the interquartile range of the statistic measured window by window over that run
(`figures.noise`): a change smaller than that is within what either run did
by itself from one minute to the next.

    >>> beyond(0.120, 0.100, 0.004, 0.006)
    {'seconds': 0.02, 'ratio': 0.2, 'noise': 0.01, 'beyond_noise': True}
    >>> beyond(0.104, 0.100, 0.004, None)["beyond_noise"] is None
    True
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from trainprof.compare.figures import STATISTICS, RunFigures

VERSION = 1
# Step-time statistics compared, in the order a person reads them.
STEP_STATISTICS = ("p50", "p95", "mean")


class CompareError(ValueError):
    """Input compare cannot use, as one sentence naming what and where."""


@dataclasses.dataclass
class Comparison:
    """The document (the JSON contract) and the runs it was made from, for the page and
    the table."""

    doc: dict[str, Any]
    runs: list[RunFigures]

    @property
    def labels(self) -> list[str]:
        return [r.label for r in self.runs]


def beyond(b: float, a: float, noise_a: float | None, noise_b: float | None) -> dict[str, Any]:
    """B - A, its ratio to A, and whether it exceeds the runs' noise together."""
    change = b - a
    noise = None if noise_a is None or noise_b is None else noise_a + noise_b
    return {
        "seconds": _round(change),
        "ratio": _round(change / a) if a else None,
        "noise": _round(noise),
        "beyond_noise": None if noise is None else abs(change) > noise,
    }


def bucket_of(value: float, buckets: list[tuple[float, float]]) -> tuple[float, float]:
    """The histogram bucket (lower, upper bound] a quantile was interpolated in.

    >>> bucket_of(0.015, [(0.01, 0), (0.02, 5), (math.inf, 5)])
    (0.01, 0.02)
    """
    lower = 0.0
    for le, _ in buckets:
        if value <= le:
            return (lower, le)
        lower = le
    return (lower, math.inf)


def compare_runs(a: RunFigures, b: RunFigures) -> Comparison:
    """The comparison of run B against run A."""
    not_comparable: list[str] = []
    doc: dict[str, Any] = {
        "version": VERSION,
        "kind": "runs",
        "runs": [a.summary_json(), b.summary_json()],
        "step_time": _step_time(a, b, not_comparable),
        "phases": _phases(a, b, not_comparable),
        "utilization": _utilization(a, b, not_comparable),
        "gpu_memory": _gpu_memory(a, b, not_comparable),
    }
    rules, changes = _rules(a, b, not_comparable)
    doc["rules"] = rules
    doc["verdict_changes"] = changes
    _sizes(a, b, not_comparable)
    doc["not_comparable"] = not_comparable
    doc["notes"] = [f"{r.label}: {note}" for r in (a, b) for note in r.notes]
    return Comparison(doc, [a, b])


def _step_time(a: RunFigures, b: RunFigures, not_comparable: list[str]) -> dict | None:
    missing = [r.label for r in (a, b) if r.step_time is None]
    if missing:
        not_comparable.append(
            f"step time: {' and '.join(missing)} recorded no training steps (no trainprof "
            "training API, or SageMaker output without framework traces)"
        )
        return None
    assert a.step_time is not None and b.step_time is not None
    runs = {}
    for r in (a, b):
        st = r.step_time
        assert st is not None
        runs[r.label] = {
            "steps": st.steps,
            **{name: _round(getattr(st, name)) for name in STEP_STATISTICS},
            "noise": {name: _round(st.noise(name)) for name in STEP_STATISTICS},
            "distribution": [
                {"le": le if math.isfinite(le) else "+Inf", "share": _round(share)}
                for le, share in st.shares()
            ],
        }
    change = {}
    for name in STEP_STATISTICS:
        va, vb = getattr(a.step_time, name), getattr(b.step_time, name)
        if va is None or vb is None:
            continue
        change[name] = beyond(vb, va, a.step_time.noise(name), b.step_time.noise(name))
        if name != "mean":
            bounds = [bucket_of(v, st.buckets) for v, st in ((va, a.step_time), (vb, b.step_time))]
            change[name]["same_bucket"] = bounds[0] == bounds[1]
            if bounds[0] == bounds[1]:
                # Interpolated inside one bucket: the histogram does not resolve the change.
                change[name]["beyond_noise"] = None
    quiet = [r.label for r in (a, b) if r.step_time and r.step_time.noise("p50") is None]
    if quiet:
        not_comparable.append(
            f"step-time noise: {' and '.join(quiet)} too short to measure how much its step "
            "time moves by itself (fewer than 5 windows); changes are not judged against it"
        )
    return {"runs": runs, "change": change}


def _phases(a: RunFigures, b: RunFigures, not_comparable: list[str]) -> dict | None:
    missing = [r.label for r in (a, b) if not r.phases]
    if missing:
        not_comparable.append(
            f"phase breakdown: {' and '.join(missing)} timed no phases (trainprof.phase())"
        )
        return None
    rows = {}
    timed = [
        p
        for p in sorted(set(a.phases) | set(b.phases))
        if any(r.phases.get(p, (None, None))[1] for r in (a, b))
    ]
    for phase in timed:
        # A phase one run never timed took none of its time.
        found = {r.label: r.phases.get(phase, (0.0, 0.0)) for r in (a, b)}
        row: dict[str, Any] = {
            "runs": {
                label: {"share": _round(share), "seconds_per_step": _round(per_step)}
                for label, (share, per_step) in found.items()
            }
        }
        pa, pb = found[a.label][1], found[b.label][1]
        row["change_seconds_per_step"] = (
            _round(pb - pa) if pa is not None and pb is not None else None
        )
        rows[phase] = row
    moves = sorted(
        (
            (phase, row["change_seconds_per_step"])
            for phase, row in rows.items()
            if row["change_seconds_per_step"] is not None
        ),
        key=lambda m: -abs(m[1]),
    )
    return {
        "phases": rows,
        "moved": [{"phase": p, "change_seconds_per_step": d} for p, d in moves],
    }


def _utilization(a: RunFigures, b: RunFigures, not_comparable: list[str]) -> dict:
    out = {}
    for resource in list(a.usage) + [r for r in b.usage if r not in a.usage]:
        if resource not in a.usage or resource not in b.usage:
            only = a.label if resource in a.usage else b.label
            not_comparable.append(f"{resource}: only {only} recorded it")
            continue
        out[resource] = {
            "runs": {
                r.label: {k: _round(r.usage[resource][k]) for k in STATISTICS} for r in (a, b)
            },
            "change": {
                k: _round(b.usage[resource][k] - a.usage[resource][k]) for k in ("p50", "p95")
            },
        }
    return out


def _gpu_memory(a: RunFigures, b: RunFigures, not_comparable: list[str]) -> dict:
    missing = [r.label for r in (a, b) if r.gpu_memory_peak_bytes is None]
    if missing and len(missing) < 2:
        not_comparable.append(
            f"GPU memory in bytes: {' and '.join(missing)} has none (SageMaker records it as "
            "a share of the GPU's memory only); the share is compared instead"
        )
    return {
        r.label: {
            "peak_bytes": r.gpu_memory_peak_bytes,
            "total_bytes": r.gpu_memory_total_bytes,
        }
        for r in (a, b)
    }


def _rules(
    a: RunFigures, b: RunFigures, not_comparable: list[str]
) -> tuple[dict[str, dict], list[dict]]:
    rules: dict[str, dict] = {}
    changes = []
    for name in list(a.rules) + [n for n in b.rules if n not in a.rules]:
        rules[name] = {r.label: r.rules[name].as_json() for r in (a, b) if name in r.rules}
        if name not in a.rules or name not in b.rules:
            only = a.label if name in a.rules else b.label
            not_comparable.append(f"{name}: configured in {only} only")
            continue
        before, after = a.rules[name].status, b.rules[name].status
        if before != after:
            changes.append({"rule": name, "from": before, "to": after})
        if a.parameters.get(name) != b.parameters.get(name):
            not_comparable.append(
                f"{name}: configured differently ({a.label}: {a.parameters.get(name)}; "
                f"{b.label}: {b.parameters.get(name)}); each verdict is its own run's"
            )
    return rules, changes


def _sizes(a: RunFigures, b: RunFigures, not_comparable: list[str]) -> None:
    def size(r: RunFigures) -> str:
        return f"{r.nodes} node(s), {r.gpus} GPU(s), {r.ranks} rank(s)"

    if (a.nodes, a.gpus, a.ranks) != (b.nodes, b.gpus, b.ranks):
        not_comparable.append(
            f"sizes differ ({a.label}: {size(a)}; {b.label}: {size(b)}): figures are compared "
            "per step and per GPU, totals are not"
        )
    if a.scrape_interval != b.scrape_interval:
        not_comparable.append(
            f"scrape intervals differ ({a.label}: {a.scrape_interval:g}s, {b.label}: "
            f"{b.scrape_interval:g}s): windowed figures (noise, charts) have different "
            "resolutions"
        )


def _round(x: float | None, digits: int = 6) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, digits)

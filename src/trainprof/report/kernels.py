"""The report's "GPU kernels" section from Kineto traces, one per rank: SageMaker Profiler's
dashboard panels (GPU active time, top kernels by time and by launches, kernel precision, GPU
activity, memory operations, step time distribution, annotation histograms).

    section = kernel_section({"0": summarize(read_trace("rank0.pt.trace.json.gz"))})
    [c.title for c in section.charts][:3]
    # ['GPU time by overlap class', 'Top kernels by time (all ranks)', 'Kernel precision']
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from trainprof.report import format as fmt
from trainprof.report import svg
from trainprof.report.build import Chart, Section, Table
from trainprof.trace.classify import short_name
from trainprof.trace.window import describe

TOP = 15
HISTOGRAM_BINS = 10
MAX_ANNOTATIONS = 6
NAME_WIDTH = 110


def _name(name: str) -> str:
    return name if len(name) <= NAME_WIDTH else name[: NAME_WIDTH - 1] + "…"


def _share(title: str, parts: dict[str, float], wide: bool = True) -> Chart | None:
    items = sorted(((k, v) for k, v in parts.items() if v > 0), key=lambda kv: -kv[1])
    if not items:
        return None
    total = sum(v for _, v in items)
    legend = [
        (f"{k} {fmt.duration(v)} ({v / total:.1%})", svg.color(i)) for i, (k, v) in enumerate(items)
    ]
    return Chart(title, svg.share_bar(items, title), legend, wide=wide)


def histogram(values: list[float], bins: int = HISTOGRAM_BINS) -> list[tuple[str, float]]:
    """Equal-width bins labelled by their upper edge: [("≤ 12ms", 3), ...]."""
    if not values:
        return []
    low, high = min(values), max(values)
    if high <= low:
        return [(f"{fmt.axis(high, 's')}", float(len(values)))]
    width = (high - low) / bins
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - low) / width))] += 1
    return [(f"≤{fmt.axis(low + (i + 1) * width, 's')}", float(c)) for i, c in enumerate(counts)]


def _merge_kernels(ranks: dict[str, dict[str, Any]], key: str) -> list[list]:
    totals: dict[str, list] = defaultdict(lambda: [0.0, 0])
    for s in ranks.values():
        for k in s.get(key, []):
            totals[k["name"]][0] += k["seconds"]
            totals[k["name"]][1] += k["launches"]
    return [[n, t[0], t[1]] for n, t in totals.items()]


def _kernels_table(kernels: list[list], caption: str, launches_first: bool = False) -> Table:
    """One row a kernel ([name, seconds, launches]): its time and launches (or launches and
    time), and the mean time of a launch."""
    columns = ["Launches", "Time"] if launches_first else ["Time", "Launches"]
    rows = []
    for n, t, c in kernels:
        took, launched = fmt.duration(t), fmt.number(c)
        middle = [launched, took] if launches_first else [took, launched]
        rows.append([_name(n), *middle, fmt.duration(t / c)])
    return Table(["Kernel", *columns, "Mean"], rows, numeric=(1, 2, 3), caption=caption)


def _sum(ranks: dict[str, dict[str, Any]], key: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for s in ranks.values():
        for k, v in s.get(key, {}).items():
            out[k] += v
    return dict(out)


def _windows(ranks: dict[str, dict[str, Any]]) -> str:
    """Which part of the traces the section covers (`trainprof.trace.window`)."""
    said = {rank: describe(s["window"]) for rank, s in ranks.items() if "window" in s}
    if len(set(said.values())) <= 1:
        return next(iter(said.values()), "the whole trace")
    return "; ".join(
        f"rank {r}: {text}" for r, text in sorted(said.items(), key=lambda kv: int(kv[0]))
    )


def kernel_section(ranks: dict[str, dict[str, Any]], notes: list[str] | None = None) -> Section:
    """`ranks`: rank -> `trainprof.trace.summarize` output."""
    section = Section(
        "gpu-kernels",
        "GPU kernels",
        "Kernel-level view from the PyTorch profiler traces (one per rank), as SageMaker "
        "Profiler showed it: where GPU time goes, which kernels, at which precision. Busy "
        "time counts every instant once; per-kernel and per-activity times add up durations, "
        "so kernels running side by side on two streams both count.",
    )
    if not ranks:
        section.empty = "No readable trace."
        return section
    span = sum(s["span_seconds"] for s in ranks.values())
    idle = sum(s["idle_seconds"] for s in ranks.values())
    gpus = sorted({s["gpu"].get("name", "") for s in ranks.values() if s.get("gpu")})
    launches = sum(s.get("kernels", {}).get("launches", 0) for s in ranks.values())
    cpu = sum(s["cpu_gpu_overlap"]["cpu_busy_seconds"] for s in ranks.values())
    both = sum(s["cpu_gpu_overlap"]["both_busy_seconds"] for s in ranks.values())
    section.facts += [
        ("Window", _windows(ranks)),
        ("Ranks", str(len(ranks))),
        ("GPU", ", ".join(gpus) or "-"),
        ("GPU active time", f"{fmt.duration(span - idle)} of {fmt.duration(span)}"),
        ("GPU active", fmt.value((span - idle) / span, "percentunit") if span else "-"),
        ("Kernels and copies launched", fmt.number(launches)),
        ("CPU active (operators)", fmt.duration(cpu)),
        ("CPU and GPU busy at once", fmt.duration(both)),
    ]
    section.tables.append(
        Table(
            [
                "Rank",
                "Span",
                "Active",
                "Idle",
                "Compute",
                "Communication",
                "Memory",
                "Launch latency p50",
                "p95",
            ],
            [
                [
                    rank,
                    fmt.duration(s["span_seconds"]),
                    fmt.duration(s["span_seconds"] - s["idle_seconds"]),
                    fmt.value(s["idle_seconds"] / s["span_seconds"], "percentunit")
                    if s["span_seconds"]
                    else "-",
                    *(
                        fmt.duration(
                            sum(v for k, v in s["gpu_time_seconds"].items() if cls in k.split("+"))
                        )
                        for cls in ("compute", "communication", "memory")
                    ),
                    fmt.duration(s["launch_latency_seconds"].get("p50", float("nan"))),
                    fmt.duration(s["launch_latency_seconds"].get("p95", float("nan"))),
                ]
                for rank, s in sorted(ranks.items(), key=lambda kv: int(kv[0]))
            ],
            numeric=tuple(range(1, 9)),
            caption="GPU active time per rank (compute, communication, memory: time each "
            "class runs, overlaps included)",
        )
    )
    chart = _share("GPU time by overlap class", _sum(ranks, "gpu_time_seconds"))
    if chart:
        section.charts.append(chart)

    kernels = _merge_kernels(ranks, "top_kernels")
    by_time = sorted(kernels, key=lambda k: (-k[1], k[0]))[:TOP]
    if by_time:
        busy = sum(s.get("kernels", {}).get("seconds", 0.0) for s in ranks.values())
        top_share = {short_name(n): t for n, t, _ in by_time[:8]}
        rest = busy - sum(top_share.values())
        if rest > 0:
            top_share["other"] = rest
        chart = _share("Top kernels by time (all ranks)", top_share)
        if chart:
            section.charts.append(chart)
        caption = f"Top {len(by_time)} kernels by time (memcpy and memset included)"
        section.tables.append(_kernels_table(by_time, caption))
    by_launches = sorted(
        _merge_kernels(ranks, "top_kernels_by_launches"), key=lambda k: (-k[2], -k[1], k[0])
    )[:TOP]
    if by_launches:
        caption = f"Top {len(by_launches)} kernels by launches"
        section.tables.append(_kernels_table(by_launches, caption, launches_first=True))
    for title, key in (
        ("Kernel precision", "precision_seconds"),
        ("GPU activity", "activity_seconds"),
    ):
        chart = _share(title, _sum(ranks, key), wide=False)
        if chart:
            section.charts.append(chart)

    memory: dict[str, list] = defaultdict(lambda: [0, 0.0, 0, False])
    for s in ranks.values():
        for name, m in s.get("memory_operations", {}).items():
            row = memory[name]
            row[0] += m["count"]
            row[1] += m["seconds"]
            row[2] += m["bytes"]
            row[3] = m["pageable"]
    if memory:
        section.tables.append(
            Table(
                ["Memory operation", "Count", "Time", "Bytes", "Bandwidth", "Pageable"],
                [
                    [
                        name,
                        fmt.number(c),
                        fmt.duration(t),
                        fmt.number(b),
                        fmt.value(b / t, "Bps") if t and b else "-",
                        "yes" if pageable else "no",
                    ]
                    for name, (c, t, b, pageable) in sorted(
                        memory.items(), key=lambda kv: -kv[1][1]
                    )
                ],
                numeric=(1, 2, 3, 4),
                caption="GPU memory operations",
            )
        )

    steps = [d for s in ranks.values() for d in s.get("steps", {}).get("durations_seconds", [])]
    if steps:
        section.charts.append(
            Chart(
                "Step time distribution",
                svg.bar_chart(histogram(steps), unit="none", label="Step time distribution"),
                [],
                note=f"{len(steps)} profiled steps (ProfilerStep#N), all ranks",
            )
        )
    annotations: dict[str, list[float]] = defaultdict(list)
    for s in ranks.values():
        for name, a in s.get("annotations", {}).items():
            annotations[name] += a.get("durations_seconds", [])
    for name, values in sorted(annotations.items(), key=lambda kv: -sum(kv[1]))[:MAX_ANNOTATIONS]:
        section.charts.append(
            Chart(
                f"Annotation: {_name(name)}",
                svg.bar_chart(histogram(values), unit="none", label=f"Annotation {name}"),
                [],
                note=f"{len(values)} ranges, {fmt.duration(sum(values))} in all",
            )
        )
    for note in notes or []:
        section.intro += f" {note}"
    return section

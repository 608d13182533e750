"""The comparison as a table on the terminal: the same figures as the JSON and the page,
one line each, a change column and the rules whose verdict changed."""

from __future__ import annotations

from typing import IO

from trainprof.compare.page import percent, points, ratio, seconds, signed
from trainprof.report import format as fmt
from trainprof.report.format import visible


def render(doc: dict) -> str:
    kind = doc["kind"]
    lines = _header(doc)
    if kind == "runs":
        lines += _runs(doc)
    elif kind == "traces":
        lines += _traces(doc)
    lines += _rules(doc)
    if doc.get("disagreements"):
        lines.append("")
        lines.append("  where SageMaker and trainprof differ:")
        for d in doc["disagreements"]:
            lines.append(f"    {d['rule']}: SageMaker {d['sagemaker']}, trainprof {d['trainprof']}")
            lines.append(f"      {d['reason']}")
    if doc.get("not_comparable"):
        lines.append("")
        lines.append("  not compared:")
        lines += [f"    - {item}" for item in doc["not_comparable"]]
    return "\n".join(visible(line) for line in lines) + "\n"


def write(doc: dict, out: IO[str]) -> None:
    out.write(render(doc))


def _header(doc: dict) -> list[str]:
    lines = []
    for r in doc["runs"]:
        what = r.get("training_job") or ""
        lines.append(f"{r['label']}: {what + ' ' if what else ''}({r.get('source', '')})")
    return lines + [""]


def _row(name: str, a: str, b: str, change: str = "", judged: str = "") -> str:
    return f"  {name:<30} {a:>14} {b:>14} {change:>14}  {judged}".rstrip()


def _runs(doc: dict) -> list[str]:
    ra, rb = doc["runs"]
    a, b = ra["label"], rb["label"]
    lines = [_row("", a, b, "change")]
    for key, name in (("nodes", "nodes"), ("gpus", "GPUs"), ("ranks", "ranks"), ("steps", "steps")):
        lines.append(_row(name, fmt.number(ra[key]), fmt.number(rb[key])))
    lines.append(_row("duration", fmt.duration(ra["seconds"]), fmt.duration(rb["seconds"])))
    st = doc["step_time"]
    if st:
        for name in ("p50", "p95", "mean"):
            change = st["change"].get(name)
            judged = ""
            if change:
                judged = {True: "beyond noise", False: "within noise", None: "not judged"}[
                    change["beyond_noise"]
                ]
                if change.get("same_bucket"):
                    judged = "inside one histogram bucket"
                elif change["noise"] is not None:
                    judged += f" (±{seconds(change['noise'])})"
            lines.append(
                _row(
                    f"step time {name}",
                    seconds(st["runs"][a][name]),
                    seconds(st["runs"][b][name]),
                    f"{ratio(change['ratio'])}" if change else "",
                    judged,
                )
            )
    phases = doc["phases"]
    if phases:
        for move in phases["moved"]:
            row = phases["phases"][move["phase"]]
            if not move["change_seconds_per_step"]:
                continue
            lines.append(
                _row(
                    f"{move['phase']} per step",
                    seconds(row["runs"][a]["seconds_per_step"]),
                    seconds(row["runs"][b]["seconds_per_step"]),
                    signed(move["change_seconds_per_step"]),
                )
            )
    for resource, found in doc["utilization"].items():
        for stat in ("p50", "p95"):
            va, vb = found["runs"][a][stat], found["runs"][b][stat]
            lines.append(
                _row(
                    f"{resource} {stat}",
                    percent(va),
                    percent(vb),
                    points(vb - va) if va is not None and vb is not None else "",
                )
            )
    return lines


def _traces(doc: dict) -> list[str]:
    ra, rb = doc["runs"]
    a, b = ra["label"], rb["label"]
    per = doc["time_classes"]["per"]
    lines = [_row(f"GPU time ({per})", a, b, "change")]
    for name, row in doc["time_classes"]["classes"].items():
        lines.append(
            _row(name, seconds(row["runs"][a]), seconds(row["runs"][b]), signed(row["change"]))
        )
    for key in ("kernels", "operators"):
        counts = doc[key]["summary"]
        lines.append("")
        lines.append(
            f"  {key}: " + ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in counts.items())
        )
        moved = [e for e in doc[key]["entries"] if e["change"] != "unchanged"][:10]
        for e in moved:
            lines.append(
                f"    {e['change']:<12} {signed(e['change_seconds']):>12}  {e['name'][:90]}"
            )
    return lines


def _rules(doc: dict) -> list[str]:
    if not doc["rules"]:
        return []
    labels = [r["label"] for r in doc["runs"]]
    lines = ["", "  " + f"{'rule':<26}" + "".join(f"{label:>16}" for label in labels)]
    changed = {c["rule"] for c in doc.get("verdict_changes", [])}
    changed |= {d["rule"] for d in doc.get("disagreements", [])}
    for rule, by_run in doc["rules"].items():
        cells = ""
        for label in labels:
            v = by_run.get(label)
            count = (v.get("times_triggered") or v.get("triggered") or 0) if v else 0
            shown = (v["status"] + (f" x{count}" if v["status"] == "fired" else "")) if v else "-"
            cells += f"{shown:>16}"
        lines.append(f"  {rule:<26}{cells}" + ("   changed" if rule in changed else ""))
    return lines

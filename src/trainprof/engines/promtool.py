"""Driving `promtool test rules` as a rule engine: input series in, firing alerts out.

promtool's unit-test mode runs the real Prometheus rule manager (recording rules, `for:`,
ALERTS) over series given at a fixed interval. Replay and the rule scenarios write such a
test; replay asks, at every evaluation, for `ALERTS{alertstate="firing"}` with no expected
samples, so promtool reports every firing alert as a mismatch, which `firing_alerts` parses.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from trainprof.contract.durations import format_duration

# promtool's unit-test engine refuses a query loading more than 10,000 samples: ranges the
# rules and replay read over one series per scrape stay within this many scrapes.
SAFE_SCRAPES = 9_000


class SeriesValues(Protocol):
    """Series to feed promtool: (series text, its values, or them already in promtool's
    expanding notation) by `items()`, as a dict or replay's streaming store gives them."""

    def items(self) -> Iterable[tuple[str, Sequence[float | None] | str]]: ...


def series_text(name: str, labels: dict[str, str]) -> str:
    """`name{a="1", b="2"}` with labels sorted and values escaped for promtool."""
    inner = ", ".join(f"{k}={_quote(v)}" for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def encode(values: Sequence[float | None]) -> str:
    """Values in promtool's expanding notation: runs of equal steps become `a+bxn`,
    missing values `_` (or `_xn`)."""
    out, i = [], 0
    while i < len(values):
        v = values[i]
        if v is None:
            j = i
            while j + 1 < len(values) and values[j + 1] is None:
                j += 1
            out.append("_" if j == i else f"_x{j - i + 1}")
            i = j + 1
            continue
        if not math.isfinite(v):  # promtool expands no runs of NaN or Inf
            out.append(_num(v))
            i += 1
            continue
        j, last, step = i, v, None
        while j + 1 < len(values):
            following = values[j + 1]
            if following is None or not math.isfinite(following):
                break
            d = following - last
            if step is None:
                step = d
            elif d != step:
                break
            j, last = j + 1, following
        if j == i or step is None:
            out.append(_num(v))
        elif step == 0:
            out.append(f"{_num(v)}x{j - i}")
        else:
            out.append(f"{_num(v)}{'+' if step >= 0 else '-'}{_num(abs(step))}x{j - i}")
        i = j + 1
    return " ".join(out)


def _num(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Inf" if v > 0 else "-Inf"
    return repr(float(v)) if v != int(v) else str(int(v))


def write_alerts_test(
    path: Path,
    series: SeriesValues,
    interval: float,
    evaluation_interval: float,
    end: float,
    queries: Mapping[str, tuple[str, Sequence[float]]] | None = None,
    group_order: Sequence[str] = (),
    alerts_from: float | None = None,
    active: bool = False,
) -> int:
    """Write a promtool test reporting the firing alerts at every evaluation up to `end`,
    and the result of each of `queries` (name -> (PromQL, evaluation times)); return the
    number of evaluations. `group_order`: the groups' evaluation order at each time
    (promtool's is random otherwise, which matters once a group reads another's
    recordings); `alerts_from`: the first evaluation to report alerts at (default: the
    first; with `active`, from 0); `active`: report pending alerts too (with their
    `alertstate`). Written by hand, not through PyYAML: a replay holds millions of values
    and the YAML emitter would take minutes."""
    times = []
    # The rule manager evaluates at 0 too: an active alert's state starts there.
    first = 0.0 if active else evaluation_interval
    t = first if alerts_from is None else alerts_from
    while t <= end + 1e-9:
        times.append(t)
        t += evaluation_interval
    with open(path, "w", encoding="utf-8") as f:
        f.write("rule_files: [rules.yaml]\n")
        f.write(f"evaluation_interval: {format_duration(evaluation_interval)}\n")
        if group_order:
            f.write("group_eval_order:\n")
            f.writelines(f"- {json.dumps(name)}\n" for name in group_order)
        f.write("tests:\n")
        f.write(f"- interval: {format_duration(interval)}\n  input_series:\n")
        for key, values in series.items():
            text = values if isinstance(values, str) else encode(values)
            f.write(f"  - series: {json.dumps(key)}\n    values: {json.dumps(text)}\n")
        f.write("  promql_expr_test:\n")
        alerts = "'ALERTS'" if active else "'ALERTS{alertstate=\"firing\"}'"
        for t in times:
            f.write(
                f"  - expr: {alerts}\n    eval_time: {format_duration(t)}\n    exp_samples: []\n"
            )
        for name, (expr, query_times) in (queries or {}).items():
            if not _QUERY_NAME.match(name):
                raise ValueError(f"query name {name!r} is not [A-Za-z0-9_.-]+")
            tagged = json.dumps(f'label_replace(({expr}), "{QUERY_LABEL}", "{name}", "", "")')
            for t in query_times:
                f.write(
                    f"  - expr: {tagged}\n    eval_time: {format_duration(t)}\n"
                    "    exp_samples: []\n"
                )
    return len(times)


_TIME = re.compile(r'^\s*expr: "ALERTS(?:\{alertstate=\\"firing\\"\})?", time: (\S+),\s*$')
_ANY_TIME = re.compile(r'^\s*expr: ".*", time: (\S+),\s*$')
_QUERY_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
# The label replay's extra queries are tagged with, so their results can be told apart.
QUERY_LABEL = "trainprof_query"


def firing_alerts(output: str | Iterable[str]) -> dict[float, list[dict[str, str]]]:
    """{evaluation time (s): [alert labels]} from promtool's report of an `alerts_test`
    (its text, or its lines). Evaluations reporting the same alerts share one list: at a
    1 s evaluation a long replay reports the same few alerts thousands of times."""
    from trainprof.contract.durations import parse_duration

    firing: dict[float, list[dict[str, str]]] = {}
    seen: dict[str, list[dict[str, str]]] = {}
    current = None
    for line in output.splitlines() if isinstance(output, str) else output:
        match = _TIME.match(line)
        if match:
            current = parse_duration(match.group(1))
            continue
        stripped = line.strip()
        if current is not None and stripped.startswith("got:"):
            alerts = seen.get(stripped)
            if alerts is None:
                alerts = seen[stripped] = [labels for labels, _ in parse_samples(stripped[4:])]
            firing[current] = alerts
            current = None
    return firing


def parse_samples(text: str) -> list[tuple[dict[str, str], float]]:
    """Parse promtool's `{a="1", b="x\\"y"} 1E+00, {...} 2E+00` sample lists."""
    samples, i, n = [], 0, len(text)
    while i < n:
        while i < n and text[i] in " ,":
            i += 1
        if i >= n:
            break
        if text[i] != "{":
            raise ValueError(f"unexpected promtool output near {text[i : i + 40]!r}")
        i += 1
        labels: dict[str, str] = {}
        while True:
            while text[i] in " ,":
                i += 1
            if text[i] == "}":
                i += 1
                break
            eq = text.index("=", i)
            key = text[i:eq]
            i = eq + 1
            if text[i] != '"':
                raise ValueError(f"unexpected promtool output near {text[i : i + 40]!r}")
            i += 1
            chars = []
            while text[i] != '"':
                if text[i] == "\\":
                    char, i = _unescape(text, i)
                    chars.append(char)
                else:
                    chars.append(text[i])
                    i += 1
            i += 1
            labels[key] = "".join(chars)
        end = i
        while end < n and text[end] != ",":
            end += 1
        value = text[i:end].strip()
        samples.append((labels, float(value) if value else float("nan")))
        i = end
    return samples


_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


def _unescape(text: str, i: int) -> tuple[str, int]:
    """The character of the Go-quoted escape at text[i] (a backslash) and the index after
    it: promtool prints label values with Go's %q (\\t, \\u202e, \\xff, \\377)."""
    kind = text[i + 1]
    if kind in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[kind], i + 2
    if kind in _HEX_ESCAPES:
        width = _HEX_ESCAPES[kind]
        return chr(int(text[i + 2 : i + 2 + width], 16)), i + 2 + width
    if kind in "01234567":
        return chr(int(text[i + 1 : i + 4], 8)), i + 4
    return kind, i + 2


class PromtoolError(RuntimeError):
    """promtool failed for a reason other than the firing alerts it was asked to report."""


@dataclasses.dataclass
class RuleRun:
    """What promtool's rule engine reported: firing alerts and query results, each keyed by
    evaluation time (seconds from the first sample)."""

    firing: dict[float, list[dict[str, str]]]
    queries: dict[str, dict[float, list[tuple[dict[str, str], float]]]]


def run_rules(
    groups: list[dict],
    series: SeriesValues,
    interval: float,
    evaluation_interval: float,
    end: float,
    workdir: Path,
    promtool: str | None = None,
    timeout: float = 3600,
    queries: Mapping[str, tuple[str, Sequence[float]]] | None = None,
    ordered: bool = False,
    alerts_from: float | None = None,
    active: bool = False,
) -> RuleRun:
    """Evaluate `groups` over `series` with the real rule engine: the firing alerts at every
    evaluation time (seconds from the first sample), and the results of `queries` (name ->
    (PromQL returning an instant vector, the evaluation times)) over the same series and rules;
    `ordered`: groups evaluated in the order given at each time, as chained groups need;
    `active`: `firing` holds the pending alerts too (their condition holds), each with its
    `alertstate`."""
    from trainprof.generation.render import to_yaml

    promtool = promtool or shutil.which("promtool")
    if promtool is None:
        raise FileNotFoundError(
            "promtool is not installed (apt-get install prometheus, or scripts/install-tools.sh)"
        )
    (workdir / "rules.yaml").write_text(to_yaml({"groups": strip_annotations(groups)}))
    write_alerts_test(
        workdir / "test.yaml",
        series,
        interval,
        evaluation_interval,
        end,
        queries,
        group_order=[g["name"] for g in groups] if ordered else (),
        alerts_from=alerts_from,
        active=active,
    )
    # promtool's report grows with the evaluations (every firing alert at each one): it goes
    # to a file and is read line by line, not held whole in memory.
    report = workdir / "promtool.out"
    with report.open("w") as out:
        result = subprocess.run(
            [promtool, "test", "rules", "test.yaml"],
            cwd=workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
    with report.open() as lines:
        unexpected = [
            line.rstrip("\n")
            for line in lines
            if line.strip()
            and not (
                _ANY_TIME.match(line)
                or line.strip().startswith(
                    ("exp: nil", "got: ", "FAILED:", "SUCCESS", "Unit Testing:")
                )
            )
        ][:20]
    if result.returncode not in (0, 1) or unexpected:
        with report.open("rb") as tail:
            tail.seek(max(tail.seek(0, 2) - 2000, 0))
            raise PromtoolError("\n".join(unexpected) or tail.read().decode("utf-8", "replace"))
    with report.open() as lines:
        firing = firing_alerts(lines)
    with report.open() as lines:
        return RuleRun(firing, _query_results(lines))


def _query_results(
    output: Iterable[str],
) -> dict[str, dict[float, list[tuple[dict[str, str], float]]]]:
    from trainprof.contract.durations import parse_duration

    results: dict[str, dict[float, list]] = {}
    current = None
    for line in output:
        match = _ANY_TIME.match(line)
        if match:
            current = None if _TIME.match(line) else parse_duration(match.group(1))
            continue
        stripped = line.strip()
        if current is not None and stripped.startswith("got:"):
            for labels, value in parse_samples(stripped[4:]):
                name = labels.pop(QUERY_LABEL, None)
                if name is not None:
                    results.setdefault(name, {}).setdefault(current, []).append((labels, value))
            current = None
    return results


def strip_annotations(groups: Iterable[dict]) -> list[dict]:
    """Rules without annotations: templates cannot fail a behaviour test."""
    return [
        {**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]}
        for g in groups
    ]

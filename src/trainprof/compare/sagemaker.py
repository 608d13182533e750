"""SageMaker's own verdicts beside trainprof's, for a SageMaker job folder.

ProfilerReport wrote one JSON per rule under `ProfilerReport/profiler-output/profiler-reports/`:
`{"RuleTriggered": int, "Violations": int, "Details": {...}, "Datapoints": int,
"RuleParameters": "k:v\\n..."}`. They are read here as SageMaker's verdicts (the run labelled
`sagemaker`): fired when the rule triggered, no data when it analysed no datapoint, quiet
otherwise. When the folder also holds the job's raw profiler data (system/, framework/),
trainprof replays it with the parameters SageMaker ran with (the run labelled `trainprof`),
and every rule whose verdicts differ is listed with why. When it holds none (the reports
were all that was kept), SageMaker's verdicts are shown alone, marked as such.

    >>> v = SageMakerVerdict.of("LowGPUUtilization", {"RuleTriggered": 13, "Violations": 13,
    ...     "Details": {"algo-1": {"gpu0": {"p95": 0.0}}}, "Datapoints": 2526,
    ...     "RuleParameters": "threshold_p95:70\\nthreshold_p5:10\\nwindow:500\\npatience:1000"})
    >>> v.status, v.measured()["value"], v.parameters["threshold_p95"]
    ('fired', 0.0, '70')
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from typing import Any

from trainprof.compare.figures import Verdict
from trainprof.compare.runs import VERSION, CompareError, Comparison
from trainprof.contract.validation import short
from trainprof.replay import sagemaker as raw
from trainprof.rules.catalog import registry
from trainprof.rules.status import FIRED, NO_DATA, QUIET

SAGEMAKER, TRAINPROF = "sagemaker", "trainprof"
# The reports that are summaries, not verdicts (they never trigger).
SUMMARIES = ("OverallSystemUsage", "OverallFrameworkMetrics")
MAX_REPORT_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass
class SageMakerVerdict:
    rule: str
    triggered: int
    violations: int
    datapoints: int
    parameters: dict[str, str]
    details: Any
    path: str = ""

    @classmethod
    def of(cls, rule: str, doc: Any, path: str = "") -> SageMakerVerdict:
        """A verdict from one report's JSON; ValueError says what is wrong with it."""
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        counts = {}
        for key in ("RuleTriggered", "Violations", "Datapoints"):
            value = doc.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key} is {short(value)}, not a count")
            counts[key] = value
        text = doc.get("RuleParameters", "")
        if not isinstance(text, str):
            raise ValueError(f"RuleParameters is {short(text)}, not text")
        parameters = {}
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip():
                parameters[key.strip()] = value.strip()
        return cls(
            rule,
            counts["RuleTriggered"],
            counts["Violations"],
            counts["Datapoints"],
            parameters,
            doc.get("Details"),
            path,
        )

    @property
    def status(self) -> str:
        if self.triggered:
            return FIRED
        return NO_DATA if self.datapoints == 0 else QUIET

    def measured(self) -> dict[str, Any] | None:
        """What SageMaker measured, in the shape of replay's `measured` where the report
        says it: the lowest GPU's p95 (LowGPUUtilization, BatchSize), the share of
        bottleneck datapoints at the end (CPUBottleneck, IOBottleneck)."""
        p = self.parameters
        if self.rule in ("LowGPUUtilization", "BatchSize"):
            key = "threshold_p95" if self.rule == "LowGPUUtilization" else "gpu_threshold_p95"
            lowest = _lowest_gpu_p95(self.details)
            threshold = _number(p.get(key))
            if lowest is None or threshold is None:
                return None
            return _measure(lowest / 100, None, threshold / 100, "below", f"{key} = {p[key]}%")
        if self.rule in ("CPUBottleneck", "IOBottleneck"):
            threshold = _number(p.get("threshold"))
            if not self.datapoints or threshold is None:
                return None
            share = self.violations / self.datapoints
            return _measure(share, None, threshold / 100, "above", f"threshold = {p['threshold']}%")
        return None

    def as_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "triggered": self.triggered,
            "violations": self.violations,
            "datapoints": self.datapoints,
            "parameters": self.parameters,
            "measured": self.measured(),
        }


def _measure(value, peak, threshold, fires, parameter) -> dict[str, Any]:
    return {
        "value": round(value, 4),
        "peak": None if peak is None else round(peak, 4),
        "threshold": threshold,
        "fires": fires,
        "parameter": parameter,
        "unit": "percentunit",
    }


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def _lowest_gpu_p95(details: Any) -> float | None:
    """The lowest p95 of any GPU of any node in LowGPUUtilization's or BatchSize's
    Details: {"algo-1": {"gpu0": {"p95": ...}, "gpu0_memory": ..., "cpu": ...}}."""
    found = []
    if isinstance(details, dict):
        for node in details.values():
            if not isinstance(node, dict):
                continue
            for name, stats in node.items():
                if name.startswith("gpu") and name[3:].isdigit() and isinstance(stats, dict):
                    value = stats.get("p95")
                    if isinstance(value, (int, float)) and math.isfinite(value):
                        found.append(float(value))
    return min(found) if found else None


def find_reports(job_dir: str) -> str:
    """The one profiler-reports folder under `job_dir`; CompareError when none or several."""
    if not os.path.isdir(job_dir):
        raise CompareError(f"--sagemaker {job_dir}: not a folder")
    found = raw.report_dirs(job_dir)
    if not found:
        raise CompareError(
            f"--sagemaker {job_dir}: no ProfilerReport verdicts here (looked for "
            "ProfilerReport/profiler-output/profiler-reports/*.json)"
        )
    if len(found) > 1:
        raise CompareError(
            f"--sagemaker {job_dir}: holds the reports of several jobs; give one of: "
            + ", ".join(found)
        )
    return found[0]


def read_reports(folder: str) -> tuple[dict[str, SageMakerVerdict], list[str]]:
    """Every readable report of the folder by rule, and notes on the ones skipped."""
    verdicts: dict[str, SageMakerVerdict] = {}
    skipped = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not name.endswith(".json") or not os.path.isfile(path):
            continue
        rule = name[: -len(".json")]
        try:
            if os.path.getsize(path) > MAX_REPORT_BYTES:
                raise ValueError(f"larger than {MAX_REPORT_BYTES // 2**20} MiB")
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            verdicts[rule] = SageMakerVerdict.of(rule, doc, path)
        except (OSError, UnicodeDecodeError, RecursionError) as e:
            skipped.append(f"{path} ({getattr(e, 'strerror', None) or type(e).__name__})")
        except ValueError as e:  # json.JSONDecodeError is one
            skipped.append(f"{path} ({e})")
    notes = (
        [f"skipped {len(skipped)} unreadable report(s): " + "; ".join(skipped)] if skipped else []
    )
    return verdicts, notes


def config_from(verdicts: dict[str, SageMakerVerdict]) -> tuple[dict[str, Any], list[str]]:
    """A ProfilerReport configuration with the parameters SageMaker ran each rule with
    (those trainprof knows; the others named in a note)."""
    parameters: dict[str, str] = {}
    unknown = []
    for rule, verdict in sorted(verdicts.items()):
        spec = registry.lookup(rule)
        if spec is None or spec.family == "health":
            continue
        for key, value in verdict.parameters.items():
            try:
                spec.param(key)
            except KeyError:
                unknown.append(f"{rule}.{key}")
                continue
            parameters[f"{spec.name}_{key}"] = value
    notes = []
    if unknown:
        notes.append(
            "SageMaker ran with parameters trainprof has no counterpart for, left out of the "
            "replay: " + ", ".join(unknown)
        )
    return {"rules": [{"rule": registry.PROFILER_REPORT, "parameters": parameters}]}, notes


def compare_sagemaker(
    job_dir: str,
    rules: str | None = None,
    scrape_interval: float = 15.0,
    sources: tuple[str, ...] | None = None,
) -> Comparison:
    folder = find_reports(job_dir)
    verdicts, notes = read_reports(folder)
    if not verdicts:
        raise CompareError(f"--sagemaker {job_dir}: no readable report in {folder}")
    runs: list[dict[str, Any]] = [
        {
            "label": SAGEMAKER,
            "source": folder,
            "training_job": os.path.basename(os.path.normpath(job_dir)),
            "reports": len(verdicts),
        }
    ]
    rules_doc: dict[str, dict[str, Any]] = {
        rule: {SAGEMAKER: v.as_json()} for rule, v in verdicts.items() if rule not in SUMMARIES
    }
    not_comparable: list[str] = []
    disagreements: list[dict[str, Any]] = []
    if raw.looks_like_sagemaker(job_dir):
        collected, replay_notes = _replay(job_dir, verdicts, rules, scrape_interval, sources)
        notes += replay_notes + list(collected.notes)
        runs.append(
            {
                "label": TRAINPROF,
                "source": collected.source,
                "training_job": collected.training_job,
                "start": collected.start,
                "end": collected.end,
            }
        )
        for name, verdict in collected.verdicts.items():
            rules_doc.setdefault(name, {})[TRAINPROF] = Verdict.of(verdict).as_json()
        for rule, by_run in rules_doc.items():
            if SAGEMAKER in by_run and TRAINPROF in by_run:
                theirs, mine = by_run[SAGEMAKER], by_run[TRAINPROF]
                if theirs["status"] != mine["status"]:
                    disagreements.append(_disagreement(rule, theirs, mine))
            elif TRAINPROF in by_run:
                not_comparable.append(f"{rule}: a trainprof rule SageMaker did not have")
            else:
                not_comparable.append(f"{rule}: SageMaker's only; trainprof does not implement it")
    else:
        not_comparable.append(
            f"trainprof's verdicts: {job_dir} holds no raw profiler data (system/incremental, "
            "framework/pevents) to replay, only SageMaker's reports: SageMaker's verdicts are "
            "shown alone"
        )
    doc = {
        "version": VERSION,
        "kind": "sagemaker",
        "runs": runs,
        "sagemaker_only": len(runs) == 1,
        "rules": rules_doc,
        "disagreements": disagreements,
        "system_usage": _system_usage(verdicts.get("OverallSystemUsage")),
        "not_comparable": not_comparable,
        "notes": notes,
    }
    return Comparison(doc, [])


def _replay(job_dir, verdicts, rules, scrape_interval, sources):
    from trainprof.generation.render import to_yaml
    from trainprof.report import from_replay

    if rules is not None:
        return from_replay(job_dir, rules, scrape_interval=scrape_interval, sources=sources), []
    config, notes = config_from(verdicts)
    with tempfile.TemporaryDirectory(prefix="trainprof-compare-") as tmp:
        path = os.path.join(tmp, "sagemaker-parameters.yaml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(to_yaml(config))
        collected = from_replay(job_dir, path, scrape_interval=scrape_interval, sources=sources)
    return collected, notes + ["trainprof replayed the job with the parameters SageMaker ran with"]


def _disagreement(rule: str, theirs: dict, mine: dict) -> dict[str, Any]:
    from trainprof.compare.page import measured_text

    parts = []
    if theirs["status"] == NO_DATA:
        parts.append(
            "SageMaker analysed no datapoint for it (its input, such as framework traces, "
            "was not collected)"
        )
    if mine.get("reason"):
        parts.append(f"trainprof: {mine['status'].replace('_', ' ')}, {mine['reason']}")
    if theirs.get("measured") or mine.get("measured"):
        parts.append(
            f"SageMaker measured {measured_text(theirs)}; trainprof measured {measured_text(mine)}"
        )
    if theirs["status"] == FIRED and mine["status"] == QUIET:
        parts.append(
            f"SageMaker triggered {theirs['triggered']} time(s): its verdicts stick once "
            "reached, trainprof's alerts resolve and report the end"
        )
    spec = registry.lookup(rule)
    return {
        "rule": rule,
        SAGEMAKER: theirs["status"],
        TRAINPROF: mine["status"],
        "reason": "; ".join(parts) or "the two evaluations differ near the threshold",
        "differences": spec.differences if spec else "",
    }


def _system_usage(verdict: SageMakerVerdict | None) -> list[dict[str, Any]]:
    """OverallSystemUsage's table as SageMaker wrote it: per resource and node, percentiles
    (percent; Network in bytes per second)."""
    if verdict is None or not isinstance(verdict.details, dict):
        return []
    rows = []
    for resource, nodes in verdict.details.items():
        if not isinstance(nodes, dict):
            continue
        for node, stats in nodes.items():
            if isinstance(stats, dict):
                rows.append(
                    {
                        "node": str(node),
                        "resource": str(resource),
                        **{
                            k: stats[k]
                            for k in ("min", "p50", "p95", "p99", "max")
                            if isinstance(stats.get(k), (int, float))
                        },
                    }
                )
    return rows

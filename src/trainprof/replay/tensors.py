"""Replay of a SageMaker Debugger tensor trial through the compiled tensor rules.

The trial's saved steps are folded, in order, through the live path's reductions into a
`HealthState` (`trainprof.replay.smdebug.fold`); each saved step becomes one scrape of the
health series, `STEP_SECONDS` apart, and promtool's rule engine evaluates the compiled rules
after every one. A rule's `first_fired_step` is the training step of the first saved step
after which its alert fired.

    >>> from trainprof.rules.config import load_config
    >>> config = load_config({"rules": [{"rule": "LossNotDecreasing",
    ...                                  "parameters": {"num_steps": "4", "mode": "TRAIN"}}]})
    >>> trial = "tests/data/smdebug-trials/LossNotDecreasing/fire-train-plateau"  # flat from 12
    >>> replay_trial(trial, config).rules["LossNotDecreasing"].first_fired_step
    16
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainprof.contract import metrics as contract
from trainprof.contract.names import JOB_LABEL
from trainprof.engines.promtool import run_rules, series_text
from trainprof.replay import smdebug
from trainprof.rules.job_alerts import AffectedUnit, affected_selector, units_found
from trainprof.training.health.state import HealthState

# Synthetic time between two saved steps: one scrape and one rule evaluation per saved step.
STEP_SECONDS = 60.0


@dataclasses.dataclass
class StepAlert:
    labels: dict[str, str]
    step: int
    fired_at: float  # the wall time smdebug recorded for that step


@dataclasses.dataclass
class StepVerdict:
    alerts: list[StepAlert] = dataclasses.field(default_factory=list)
    evaluated: bool = True  # False: the trial holds nothing this rule reads
    datapoints: int | None = None  # saved steps at which the rule had its input
    reason: str = ""  # why it decided nothing (no_data)
    # What its alert found (collections, ranks, ...), first and last at a save's wall time,
    # and the training steps of those saves.
    affected: list[tuple[AffectedUnit, int, int]] = dataclasses.field(default_factory=list)

    @property
    def fired(self) -> bool:
        return bool(self.alerts)

    @property
    def status(self) -> str:
        """fired | quiet | no_data (the trial held nothing the rule reads)."""
        if self.alerts:
            return "fired"
        return "quiet" if self.evaluated else "no_data"

    @property
    def first_fired_step(self) -> int | None:
        return min((a.step for a in self.alerts), default=None)

    @property
    def first_fired_at(self) -> float | None:
        return min((a.fired_at for a in self.alerts), default=None)


@dataclasses.dataclass
class TrialReplay:
    source: str
    rules: dict[str, StepVerdict]
    steps: list[int]
    notes: list[str]
    training_job: str

    def as_json(self) -> dict:
        """Replay's JSON contract plus `first_fired_step` (and each alert's `step`, each
        affected unit's `first_step` and `last_step`)."""
        return {
            "rules": {
                name: {
                    "fired": v.fired,
                    "status": v.status,
                    "datapoints": v.datapoints,
                    "reason": v.reason or None,
                    "first_fired_at": _number(v.first_fired_at),
                    "first_fired_step": v.first_fired_step,
                    "alerts": [
                        {"labels": a.labels, "fired_at": _number(a.fired_at), "step": a.step}
                        for a in v.alerts
                    ],
                    "affected": [
                        {**u.as_json(), "first_step": first, "last_step": last}
                        for u, first, last in v.affected
                    ],
                }
                for name, v in self.rules.items()
            }
        }


def _number(value: float | None):
    if value is None:
        return None
    return int(value) if float(value).is_integer() else round(value, 3)


def health_inputs(config: Any) -> dict[str, Any]:
    """What the reductions must compute for these rules, as `watch()`'s keyword arguments.

    Several rules asking for one input (two UnchangedTensor tolerances cannot both be
    computed): the first configured wins, the others are reported by the rules' warnings.
    """
    from trainprof.rules.compiler import required_inputs

    needed = required_inputs(config)
    out: dict[str, Any] = {
        "loss_num_steps": tuple(sorted(set(needed["loss_num_steps"]) | {10})),
        "token_values": tuple(sorted({t for ts in needed["token_values"] for t in ts} | {0})),
    }
    if needed["loss_delta"]:
        out["loss_delta"] = needed["loss_delta"][0]
    if needed["unchanged_tolerance"]:
        out["rtol"], out["atol"] = needed["unchanged_tolerance"][0]
    if needed["threshold_inactivity"]:
        out["threshold_inactivity"] = needed["threshold_inactivity"][0]
    return out


def replay_trial(
    source: str,
    config: Any,
    *,
    training_job: str | None = None,
    promtool: str | None = None,
    workdir: str | None = None,
    include_regex: str | None = None,
) -> TrialReplay:
    """Fold the trial at `source` through the reductions and evaluate `config`'s rules."""
    trial = smdebug.read_trial(source)
    inputs = health_inputs(config)
    state = HealthState(
        loss_num_steps=inputs["loss_num_steps"],
        loss_delta=inputs.get("loss_delta", 0.01),
        token_values=inputs["token_values"],
    )
    job = training_job or _job_name(trial.root)
    identity = {JOB_LABEL: job, "rank": "0"}

    images, sequences = config.rule("CheckInputImages"), config.rule("NLPSequenceRatio")

    def folded(t: smdebug.Trial, state: HealthState):
        return smdebug.fold(
            t,
            rtol=inputs.get("rtol", 1e-5),
            atol=inputs.get("atol", 1e-8),
            threshold_inactivity=inputs.get("threshold_inactivity", 1.0),
            include_regex=include_regex,
            state=state,
            image_regex=images.values["regex"] if images else None,
            tokens_regex=sequences.values["tokens_regex"] if sequences else None,
        )

    runs = [(folded(trial, state), identity)]
    config, other_trials = _other_trial(config, job, folded, runs)
    saves = _merged_saves(runs)
    stalled = [i for i in config.rules if i.spec.name == "StalledTrainingRule"]
    others = dataclasses.replace(
        config, rules=tuple(i for i in config.rules if not stalled or i is not stalled[0])
    )
    result = evaluate_saves(saves, others, promtool=promtool, workdir=workdir)
    if stalled:
        end = trial.end_time or (saves[-1].wall_time if saves else 0.0)
        result.rules["StalledTrainingRule"] = _stalled(
            saves, end, dataclasses.replace(config, rules=tuple(stalled)), identity, promtool
        )
    result.source, result.training_job = source, job
    # after the fold: it adds what it skipped (a damaged trees collection) to the problems
    other_problems = [f"{path}: {p}" for path, other in other_trials for p in other.problems]
    result.notes[:0] = trial.problems + other_problems
    return result


def _other_trial(
    config: Any, job: str, folded, runs: list
) -> tuple[Any, list[tuple[str, smdebug.Trial]]]:
    """SimilarAcrossRuns in replay: its other_trials names the other trial's folder, which
    is folded beside this one as another training_job; the rule compares the two."""
    instance = next((i for i in config.rules if i.spec.name == "SimilarAcrossRuns"), None)
    if instance is None:
        return config, []
    path = instance.values["other_trials"]
    other = smdebug.read_trial(path)
    other_job = _job_name(other.root)
    if other_job == job:
        other_job += "-other"
    runs.append((folded(other, HealthState()), {JOB_LABEL: other_job, "rank": "0"}))
    values = {**instance.values, "other_trials": other_job}
    rules = tuple(
        dataclasses.replace(i, values=values) if i is instance else i for i in config.rules
    )
    return dataclasses.replace(config, rules=rules), [(path, other)]


def _merged_saves(runs: list) -> list[Save]:
    """One save per step saved by any of the runs, holding every run's series as of then."""
    import heapq

    latest: dict[int, list] = {}
    saves: list[Save] = []

    def tag(n: int, snaps, ident):
        for snap in snaps:
            yield snap.step, n, snap, ident

    tagged = [tag(n, snaps, ident) for n, (snaps, ident) in enumerate(runs)]
    # merge() holds one snapshot ahead per run; each is rendered when it is yielded, while
    # its run's generator still stands at that step.
    for step, n, snap, ident in heapq.merge(*tagged, key=lambda x: (x[0], x[1])):
        latest[n] = list(snap.state.families(ident))
        if not saves or saves[-1].step != step:
            saves.append(Save(step, snap.wall_time, []))
        saves[-1].families = [f for run in sorted(latest) for f in latest[run]]
    return saves


def _stalled(saves: list[Save], end: float, config: Any, identity, promtool) -> StepVerdict:
    """StalledTrainingRule on the trial's own clock: the saves' wall times laid out on a
    grid of scrapes (`time()` starts at the first save), evaluated by promtool like the
    live rule. An alert's step is the last save before the stall."""
    from trainprof.rules.compiler import compile_rules

    verdict = StepVerdict()
    if not saves:
        return verdict
    start = saves[0].wall_time
    # a scrape every 15 s, finer for a threshold under a minute: the grid's lateness (one
    # interval at most) stays a quarter of the threshold, at least 1 s
    threshold = float(config.rules[0].values.get("threshold", 1800))
    interval = float(min(15, max(1, int(threshold / 4))))  # whole seconds: promtool's units
    points = int((max(end, saves[-1].wall_time) - start) // interval) + 2
    if points > 200_000:  # a long job: coarser scrapes, still whole seconds
        interval = float(math.ceil((max(end, saves[-1].wall_time) - start) / 200_000))
        points = int((max(end, saves[-1].wall_time) - start) // interval) + 2
    values: list[float | None] = []
    i = 0
    for k in range(points):
        while i + 1 < len(saves) and saves[i + 1].wall_time - start <= k * interval:
            i += 1
        values.append(saves[i].wall_time - start + interval)
    key = series_text(contract.TENSOR_LAST_SAVE_TIMESTAMP_SECONDS, identity)
    compiled = compile_rules(config)
    groups = [{**g, "interval": f"{interval:g}s"} for g in compiled.groups]
    with tempfile.TemporaryDirectory() as tmp:
        # time() at point k is k x interval; a save at offset o is served as o + interval,
        # so time() - value is the time since that save, one scrape late at most.
        run = run_rules(
            groups, {key: values}, interval, interval, (points - 1) * interval, Path(tmp), promtool
        )
    previous = False
    for k in range(1, points):
        firing = any(
            a.get("rule") == "StalledTrainingRule" for a in run.firing.get(k * interval, [])
        )
        if firing and not previous:
            t = start + k * interval
            last = max((s for s in saves if s.wall_time <= t), key=lambda s: s.wall_time)
            labels = {
                k2: v
                for k2, v in run.firing[k * interval][0].items()
                if k2 not in ("__name__", "alertstate")
            }
            verdict.alerts.append(StepAlert(labels, last.step, t))
        previous = firing
    return verdict


@dataclasses.dataclass
class Save:
    """The health series as scraped right after one saved step."""

    step: int
    wall_time: float
    families: list


def evaluate_saves(
    saves: list[Save], config: Any, *, promtool: str | None = None, workdir: str | None = None
) -> TrialReplay:
    """Evaluate the compiled rules once after each save (one scrape per save), through
    promtool; the live tests feed the session's families here, replay a trial's."""
    from trainprof.rules.compiler import compile_rules

    series: dict[str, Sequence[float | None]] = {}
    table: dict[str, list[float | None]] = {}
    for index, save in enumerate(saves):
        for family in save.families:
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                key = series_text(sample.name, dict(sample.labels))
                values = table.setdefault(key, [])
                values.extend([None] * (index - len(values)))
                values.append(sample.value)
    for key, values in table.items():
        values.extend([None] * (len(saves) - len(values)))
        series[key] = [None] + values  # nothing at t=0: the first save is evaluated at 1 x STEP
    compiled = compile_rules(config)
    groups = [{**g, "interval": f"{STEP_SECONDS:g}s"} for g in compiled.groups]
    end = len(saves) * STEP_SECONDS
    times = [(index + 1) * STEP_SECONDS for index in range(len(saves))]
    presence = _presence(compiled)
    queries = {name: (expr, times) for name, (expr, _) in presence.items()}
    queries["alerts.affected"] = (affected_selector([]), times)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        run = run_rules(
            groups, series, STEP_SECONDS, STEP_SECONDS, end, Path(tmp), promtool, queries=queries
        )
    verdicts = {i.spec.name: StepVerdict() for i in config.rules}
    for name in presence:
        present = sum(1 for t in times if run.queries.get(name, {}).get(t))
        verdicts[name].datapoints = present
        if not present:
            verdicts[name].evaluated = False
            verdicts[name].reason = (
                f"none of the {len(saves)} saved steps holds what {name} reads "
                f"({', '.join(presence[name][1])})"
            )
    # What each alert found, at each save's wall time.
    by_wall = {
        saves[round(t / STEP_SECONDS) - 1].wall_time: got
        for t, got in run.queries.get("alerts.affected", {}).items()
    }
    step_at = {save.wall_time: save.step for save in saves}
    for name, units in units_found(by_wall, compiled.affected, config.job_labels).items():
        if name in verdicts:
            verdicts[name].affected = [(u, step_at[u.first_at], step_at[u.last_at]) for u in units]
    previous: set[tuple] = set()
    for index, save in enumerate(saves):
        now = {
            tuple(sorted((k, v) for k, v in labels.items() if k not in ("__name__", "alertstate")))
            for labels in run.firing.get((index + 1) * STEP_SECONDS, [])
        }
        for fired in sorted(now - previous):
            alert_labels = dict(fired)
            verdict = verdicts.get(alert_labels.get("rule", ""))
            if verdict is not None:
                verdict.alerts.append(StepAlert(alert_labels, save.step, save.wall_time))
        previous = now
    steps = [s.step for s in saves]
    return TrialReplay("", verdicts, steps, list(compiled.warnings), "")


def _presence(compiled: Any) -> dict[str, tuple[str, list[str]]]:
    """Rule -> (PromQL with a series while the replayed job has any series the rule reads,
    those series' selectors)."""
    from trainprof.rules.catalog.health.common import FAMILY, input_present, input_selectors

    out = {}
    for c in compiled.rules:
        if c.instance.spec.family == FAMILY and c.output.alerts:
            exprs = [a.expr for a in c.output.alerts]
            read = list(dict.fromkeys(s for e in exprs for s in input_selectors(e)))
            out[c.name] = (input_present(exprs, c.build.job_labels), read)
    return out


def _job_name(root: Path) -> str:
    parts = [p for p in root.resolve().parts if p not in ("/", "debug-output")]
    return parts[-1] if parts else "sagemaker-job"

"""Replay of a SageMaker Debugger tensor trial through the compiled tensor rules.

The trial's saved steps are folded, in order, through the live path's reductions into a
`HealthState` (`trainprof.replay.smdebug.fold`); each saved step becomes one scrape of the
health series, `STEP_SECONDS` apart, and promtool's rule engine evaluates the compiled rules
after every one. A rule's `first_fired_step` is the training step of the first saved step
after which its alert fired.

Memory is bounded by the number of series, not of saved steps, as for profiler replay: each
step is read when folded, its series go straight into promtool's expanding notation
(`trainprof.replay.series_store`, spilling to a file), and a long trial is evaluated in time
chunks, each its own promtool run with a warm-up before it (`trainprof.replay.chunks`). What
grows with the steps is 16 bytes a save (its step and wall time).

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
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trainprof.contract import metrics as contract
from trainprof.contract.names import JOB_LABEL
from trainprof.engines.promtool import RuleRun, run_rules, series_text
from trainprof.replay import chunks, smdebug
from trainprof.replay.series_store import SeriesStore
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
    steps: Sequence[int]  # the saved steps, in order
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
    chunk_instants: int = chunks.CHUNK_INSTANTS,
) -> TrialReplay:
    """Fold the trial at `source` through the reductions and evaluate `config`'s rules
    (in chunks of `chunk_instants` saves; 0: one promtool run)."""
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
    count = _saves_at_most([trial] + [other for _, other in other_trials])
    stalled = [i for i in config.rules if i.spec.name == "StalledTrainingRule"]
    others = dataclasses.replace(
        config, rules=tuple(i for i in config.rules if not stalled or i is not stalled[0])
    )
    saved = Saved()
    result = evaluate_saves(
        saved.track(_merged_saves(runs)),
        others,
        promtool=promtool,
        workdir=workdir,
        count=count,
        chunk_instants=chunk_instants,
    )
    if stalled:
        end = trial.end_time or (saved.wall_times[-1] if saved.wall_times else 0.0)
        result.rules["StalledTrainingRule"] = _stalled(
            saved, end, dataclasses.replace(config, rules=tuple(stalled)), identity, promtool
        )
    result.source, result.training_job = source, job
    # after the fold: it adds what it skipped (a damaged trees collection) to the problems
    other_problems = [f"{path}: {p}" for path, other in other_trials for p in other.problems]
    result.notes[:0] = trial.problems + other_problems
    return result


def _saves_at_most(trials: list[smdebug.Trial]) -> int | None:
    """How many saves the trials' folds can give (the steps their files are named for, in
    any of them); None when a trial's steps are not known before it is read."""
    numbers = [getattr(t.steps, "numbers", None) for t in trials]
    if any(n is None for n in numbers):
        return None
    return int(len(np.unique(np.concatenate([np.asarray(n, dtype=np.int64) for n in numbers]))))


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


def _merged_saves(runs: list) -> Iterator[Save]:
    """One save per step saved by any of the runs, holding every run's series as of then."""
    import heapq

    latest: dict[int, list] = {}
    pending: Save | None = None

    def tag(n: int, snaps, ident):
        for snap in snaps:
            yield snap.step, n, snap, ident

    tagged = [tag(n, snaps, ident) for n, (snaps, ident) in enumerate(runs)]
    # merge() holds one snapshot ahead per run; each is rendered when it is yielded, while
    # its run's generator still stands at that step.
    for step, n, snap, ident in heapq.merge(*tagged, key=lambda x: (x[0], x[1])):
        latest[n] = list(snap.state.families(ident))
        if pending is not None and pending.step != step:
            yield pending
            pending = None
        if pending is None:
            pending = Save(step, snap.wall_time, [])
        pending.families = [f for run in sorted(latest) for f in latest[run]]
    if pending is not None:
        yield pending


class Saved:
    """The step and wall time of each save that went by, 16 bytes a save."""

    def __init__(self) -> None:
        self.steps = array("q")
        self.wall_times = array("d")

    def track(self, saves: Iterable[Save]) -> Iterator[Save]:
        for save in saves:
            self.steps.append(save.step)
            self.wall_times.append(save.wall_time)
            yield save

    def __len__(self) -> int:
        return len(self.steps)


def _stalled(saves: Saved, end: float, config: Any, identity, promtool) -> StepVerdict:
    """StalledTrainingRule on the trial's own clock: the saves' wall times laid out on a
    grid of scrapes (`time()` starts at the first save), evaluated by promtool like the
    live rule. An alert's step is the last save before the stall."""
    from trainprof.rules.compiler import compile_rules

    verdict = StepVerdict()
    if not saves:
        return verdict
    times = saves.wall_times
    start = times[0]
    # a scrape every 15 s, finer for a threshold under a minute: the grid's lateness (one
    # interval at most) stays a quarter of the threshold, at least 1 s
    threshold = float(config.rules[0].values.get("threshold", 1800))
    interval = float(min(15, max(1, int(threshold / 4))))  # whole seconds: promtool's units
    points = int((max(end, times[-1]) - start) // interval) + 2
    if points > 200_000:  # a long job: coarser scrapes, still whole seconds
        interval = float(math.ceil((max(end, times[-1]) - start) / 200_000))
        points = int((max(end, times[-1]) - start) // interval) + 2
    values: list[float | None] = []
    i = 0
    for k in range(points):
        while i + 1 < len(times) and times[i + 1] - start <= k * interval:
            i += 1
        values.append(times[i] - start + interval)
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
            last = max((i for i in range(len(times)) if times[i] <= t), key=lambda i: times[i])
            labels = {
                k2: v
                for k2, v in run.firing[k * interval][0].items()
                if k2 not in ("__name__", "alertstate")
            }
            verdict.alerts.append(StepAlert(labels, saves.steps[last], t))
        previous = firing
    return verdict


@dataclasses.dataclass
class Save:
    """The health series as scraped right after one saved step."""

    step: int
    wall_time: float
    families: list


def evaluate_saves(
    saves: Iterable[Save],
    config: Any,
    *,
    promtool: str | None = None,
    workdir: str | None = None,
    count: int | None = None,
    chunk_instants: int = chunks.CHUNK_INSTANTS,
) -> TrialReplay:
    """Evaluate the compiled rules once after each save (one scrape per save), through
    promtool; the live tests feed the session's families here, replay a trial's.

    `saves` may be a generator: with `count` (at least as many saves as it gives) each save's
    series are encoded as it comes and nothing of it is kept, so memory follows the series,
    not the saves; a trial longer than `chunk_instants` saves is evaluated in time chunks."""
    from trainprof.rules.compiler import compile_rules

    if count is None:
        saves = list(saves)
        count = len(saves)
    compiled = compile_rules(config)
    groups = [{**g, "interval": f"{STEP_SECONDS:g}s"} for g in compiled.groups]
    instants = count + 1  # nothing at t=0: the first save is evaluated at 1 x STEP_SECONDS
    presence = _presence(compiled)
    times = _Every(count, STEP_SECONDS)
    queries = {name: (expr, times) for name, (expr, _) in presence.items()}
    queries["alerts.affected"] = (affected_selector([]), times)
    plan, need, _ = chunks.plan(
        groups, queries, instants, STEP_SECONDS, STEP_SECONDS, chunk_instants, per_overlap=instants
    )
    store = (
        chunks.ChunkedStore(plan, instants, need, spill_dir=workdir)
        if plan is not None
        else SeriesStore(instants, spill_dir=workdir)
    )
    saved = Saved()
    try:
        for index, save in enumerate(saved.track(saves)):
            if index >= count:
                raise ValueError(f"more saves than the {count} counted")
            seen: set[int] = set()
            for family in save.families:
                for sample in family.samples:
                    if sample.name.endswith("_created"):
                        continue
                    series = store.id_of(sample.name, dict(sample.labels))
                    if series not in seen:  # a series given twice at a save: the first
                        seen.add(series)
                        store.put(series, index + 1, sample.value)
        verdicts = _Verdicts(config, saved)
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            _evaluate(store, groups, instants, queries, Path(tmp), promtool, verdicts.take)
    finally:
        store.close()
    for name in presence:
        present = verdicts.present.get(name, 0)
        verdicts.rules[name].datapoints = present
        if not present:
            verdicts.rules[name].evaluated = False
            verdicts.rules[name].reason = (
                f"none of the {len(saved)} saved steps holds what {name} reads "
                f"({', '.join(presence[name][1])})"
            )
    # What each alert found, at each save's wall time.
    step_at = verdicts.step_at
    for name, units in units_found(verdicts.found, compiled.affected, config.job_labels).items():
        if name in verdicts.rules:
            verdicts.rules[name].affected = [
                (u, step_at[u.first_at], step_at[u.last_at]) for u in units
            ]
    return TrialReplay("", verdicts.rules, saved.steps, list(compiled.warnings), "")


class _Every(Sequence[float]):
    """Every save's evaluation time (save i at (i + 1) x step), without a list of them."""

    def __init__(self, size: int, step: float):
        self.size, self.step = size, step

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.size))]
        if not -self.size <= i < self.size:
            raise IndexError(i)
        return ((i % self.size) + 1) * self.step

    def __iter__(self) -> Iterator[float]:
        return ((k + 1) * self.step for k in range(self.size))


class _Verdicts:
    """Each rule's alerts, from promtool's runs taken one at a time in time order: an alert
    fires at a save when it is firing there and was not at the save before. `present`:
    at how many saves each presence query had a series; `found`: what the alerts found, by
    the wall time of the save (only the saves where they found something)."""

    def __init__(self, config: Any, saved: Saved):
        self.rules = {i.spec.name: StepVerdict() for i in config.rules}
        self.saved = saved
        self.present: dict[str, int] = {}
        self.found: dict[float, list] = {}
        self.step_at: dict[float, int] = {}
        self._last: tuple[float, set[tuple]] = (0.0, set())

    def take(self, run: RuleRun) -> None:
        saves = len(self.saved)
        for t, got in run.queries.pop("alerts.affected", {}).items():
            index = round(t / STEP_SECONDS) - 1
            if got and 0 <= index < saves:
                wall_time = self.saved.wall_times[index]
                self.found[wall_time] = got
                self.step_at[wall_time] = self.saved.steps[index]
        for name, by_time in run.queries.items():
            self.present[name] = self.present.get(name, 0) + sum(
                1 for t, samples in by_time.items() if samples and t <= saves * STEP_SECONDS
            )
        for t in sorted(run.firing):
            index = round(t / STEP_SECONDS) - 1
            if not 0 <= index < saves:
                continue
            now = {
                tuple(sorted((k, v) for k, v in lb.items() if k not in ("__name__", "alertstate")))
                for lb in run.firing[t]
            }
            last_t, last = self._last
            before = last if abs(last_t - (t - STEP_SECONDS)) < 1e-6 else set()
            for fired in sorted(now - before):
                alert_labels = dict(fired)
                verdict = self.rules.get(alert_labels.get("rule", ""))
                if verdict is not None:
                    step, wall_time = self.saved.steps[index], self.saved.wall_times[index]
                    verdict.alerts.append(StepAlert(alert_labels, step, wall_time))
            self._last = (t, now)


def _evaluate(
    store: SeriesStore,
    groups: list[dict],
    instants: int,
    queries: Mapping[str, tuple[str, Sequence[float]]],
    tmp: Path,
    promtool: str | None,
    each: Callable[[RuleRun], None],
) -> None:
    """promtool's runs over the store, each handed to `each` in time order."""
    if isinstance(store, chunks.ChunkedStore):
        chunks.run_chunked(
            store, groups, STEP_SECONDS, STEP_SECONDS, tmp, promtool, queries, False, each=each
        )
        return
    end = (instants - 1) * STEP_SECONDS
    each(run_rules(groups, store, STEP_SECONDS, STEP_SECONDS, end, tmp, promtool, queries=queries))


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

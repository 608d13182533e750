"""Replay of a SageMaker Debugger tensor trial through the compiled tensor rules.

The trial's saved steps are folded, in order, through the live path's reductions into a
`HealthState` (`trainprof.replay.smdebug.fold`); each saved step becomes one scrape of the
health series, `STEP_SECONDS` apart, and promtool's rule engine evaluates the compiled rules
after every one. A rule's `first_fired_step` is the training step of the first saved step
after which its alert fired.

    >>> result = replay_trial("debug-output/", config)      # doctest: +SKIP
    >>> result.rules["LossNotDecreasing"].first_fired_step   # doctest: +SKIP
    12
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from trainprof.health.state import HealthState
from trainprof.promtool import run_rules, series_text
from trainprof.replay import smdebug

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

    @property
    def fired(self) -> bool:
        return bool(self.alerts)

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
        """Replay's JSON contract plus `first_fired_step` (and each alert's `step`)."""
        return {
            "rules": {
                name: {
                    "fired": v.fired,
                    "first_fired_at": _number(v.first_fired_at),
                    "first_fired_step": v.first_fired_step,
                    "alerts": [
                        {"labels": a.labels, "fired_at": _number(a.fired_at), "step": a.step}
                        for a in v.alerts
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
    """What the reductions must compute for these rules (watch()'s keyword arguments)."""
    out: dict[str, Any] = {"loss_num_steps": set(), "token_values": set()}
    for instance in config.rules:
        for key, value in getattr(instance.spec, "health_inputs", _no_inputs)(
            _values(instance)
        ).items():
            if isinstance(out.get(key), set):
                out[key].update(value)
            else:
                out[key] = value
    out["loss_num_steps"] = tuple(sorted(out["loss_num_steps"])) or (10,)
    out["token_values"] = tuple(sorted(out["token_values"])) or (0,)
    return out


def _no_inputs(values: Any) -> dict:
    return {}


def _values(instance: Any) -> Any:
    return getattr(instance, "params", None) or instance.values


def replay_trial(
    source: str,
    config: Any,
    *,
    training_job: str | None = None,
    promtool: str | None = None,
    workdir: str | None = None,
    include_regex: str | None = None,
) -> TrialReplay:
    from trainprof.rules.compiler import compile_rules

    trial = smdebug.read_trial(source)
    inputs = health_inputs(config)
    state = HealthState(
        loss_num_steps=inputs["loss_num_steps"],
        loss_delta=inputs.get("loss_delta", 0.01),
        token_values=inputs["token_values"],
    )
    job = training_job or _job_name(trial.root)
    identity = {"training_job": job, "rank": "0"}
    series: dict[str, list[float | None]] = {}
    steps, walls = [], []
    snapshots = smdebug.fold(
        trial,
        rtol=inputs.get("rtol", 1e-5),
        atol=inputs.get("atol", 1e-8),
        threshold_inactivity=inputs.get("threshold_inactivity", 1.0),
        include_regex=include_regex,
        state=state,
    )
    for index, snap in enumerate(snapshots):
        steps.append(snap.step)
        walls.append(snap.wall_time)
        for family in snap.state.families(identity):
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                key = series_text(sample.name, dict(sample.labels))
                values = series.setdefault(key, [None] * (index + 1))
                values.extend([None] * (index + 1 - len(values)))
                values[index] = sample.value
    for values in series.values():
        values.extend([None] * (len(steps) - len(values)))
        values.insert(0, None)  # nothing at t=0: the first saved step is evaluated at 1 x STEP
    compiled = compile_rules(config)
    groups = [{**g, "interval": f"{STEP_SECONDS:g}s"} for g in compiled.groups]
    end = len(steps) * STEP_SECONDS
    notes = list(trial.problems) + list(compiled.warnings)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        run = run_rules(groups, series, STEP_SECONDS, STEP_SECONDS, end, Path(tmp), promtool)
    names = [i.spec.name for i in config.rules]
    verdicts = {name: StepVerdict() for name in names}
    previous: set[tuple] = set()
    for index in range(len(steps)):
        t = (index + 1) * STEP_SECONDS
        now = {
            tuple(sorted((k, v) for k, v in labels.items() if k not in ("__name__", "alertstate")))
            for labels in run.firing.get(t, [])
        }
        for key in sorted(now - previous):
            labels = dict(key)
            verdict = verdicts.get(labels.get("rule", ""))
            if verdict is not None:
                verdict.alerts.append(StepAlert(labels, steps[index], walls[index]))
        previous = now
    return TrialReplay(source, verdicts, steps, notes, job)


def _job_name(root: Path) -> str:
    parts = [p for p in root.resolve().parts if p not in ("/", "debug-output")]
    return parts[-1] if parts else "sagemaker-job"

"""What `replay()` returns: a verdict per rule, the health alerts, what was replayed; and
the error it raises on input it cannot use."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from trainprof.contract.metrics import TRAINING_SERIES
from trainprof.rules.compiler import Compiled
from trainprof.rules.config import RulesConfig
from trainprof.rules.job_alerts import AffectedUnit
from trainprof.rules.status import RuleStatus


class ReplayError(ValueError):
    """Input replay cannot use: the message names the file (and line) and what is wrong."""


@dataclasses.dataclass
class FiredAlert:
    labels: dict[str, str]
    fired_at: float
    step: int | None = None  # the training step, for a tensor trial's saved steps


@dataclasses.dataclass
class Verdict:
    # One per job and reason: each time it started firing.
    alerts: list[FiredAlert] = dataclasses.field(default_factory=list)
    # fired | quiet | no_data | not_applicable, with the datapoints and measure behind it.
    status: RuleStatus | None = None
    # The units (GPUs, nodes, ranks, ...) its condition held for, pending or firing.
    affected: list[AffectedUnit] = dataclasses.field(default_factory=list)

    @property
    def fired(self) -> bool:
        return bool(self.alerts)

    @property
    def first_fired_at(self) -> float | None:
        return min((a.fired_at for a in self.alerts), default=None)

    @property
    def first_fired_step(self) -> int | None:
        return min((a.step for a in self.alerts if a.step is not None), default=None)


@dataclasses.dataclass(frozen=True)
class Query:
    """PromQL to evaluate over the replayed series: at the end only, or `over_time`.

    "The end" of a query that reads the training processes' series (`reads_training`) is
    the last scrape that saw one, when training ended before the last scrape (the
    exporters went on): their series are stale after it, as in Prometheus."""

    expr: str
    over_time: bool = False


def reads_training(expr: str) -> bool:
    """Whether PromQL reads the training processes' process, step or phase series (or a
    recording of one).

    >>> reads_training("sum(trainprof_training_steps_total)"), reads_training("up")
    (True, False)
    """
    return TRAINING_SERIES in expr


# (resolved configuration, training_job, seconds replayed) -> {name: Query}
# Given the compiled rules, the job's name and the seconds replayed: the queries to evaluate.
QueryBuilder = Callable[[Compiled, str, float], Mapping[str, Query]]
Samples = list[tuple[dict[str, str], float]]


@dataclasses.dataclass
class ReplayResult:
    rules: dict[str, Verdict]
    health: list[FiredAlert]
    source: str
    nodes: int
    gpus: int
    samples: int
    steps: int
    start: float
    end: float
    datapoint_interval: float
    scrape_interval: float
    evaluation_interval: float
    notes: list[str]
    compiled: Compiled  # the rules as replayed
    training_job: str = ""
    # dcgm-exporter's collection period, when the rules read dcgm (None: every scrape).
    collect_interval: float | None = None
    # name -> {Unix time: samples} of the queries asked for (replay(..., queries=)).
    queries: dict[str, dict[float, Samples]] = dataclasses.field(default_factory=dict)
    # promtool runs the job was evaluated in (trainprof.replay.chunks), and when one, why.
    chunks: int = 1
    one_pass: str = ""
    # Seconds after t0 where each chunk's own part starts, and the warm-up before it.
    chunk_starts: tuple[float, ...] = (0.0,)
    warmup: float = 0.0

    @property
    def config(self) -> RulesConfig:
        return self.compiled.config

    def as_json(self) -> dict:
        """Exactly the documented contract: {"rules": {"<Rule>": {"fired", "status",
        "datapoints", "measured", "first_fired_at", "alerts": [{"labels", "fired_at"}],
        "affected": [{"labels", "first_at", "last_at", "worst"}]}}}"""
        return {
            "rules": {
                name: {
                    "fired": v.fired,
                    **(v.status.as_json() if v.status else {}),
                    "first_fired_at": _number(v.first_fired_at),
                    "alerts": [
                        {"labels": a.labels, "fired_at": _number(a.fired_at)} for a in v.alerts
                    ],
                    "affected": [u.as_json() for u in v.affected],
                }
                for name, v in self.rules.items()
            }
        }


def _number(value: float | None):
    if value is None:
        return None
    return int(value) if float(value).is_integer() else round(value, 3)

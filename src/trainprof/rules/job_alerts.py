"""One alert per job and rule, held through noise: what the compiler makes of a catalog
`Alert`.

A catalog alert's expression gives the series that meet the rule's condition, one per job or
one per unit of a job (GPU, node, rank, collection: `Alert.units`). The compiler records
them in the rule's group, before its alerts, as `<level>:trainprof_rule_<rule>:affected`
(labels `rule`, `severity` and the alert's own, such as `reason`); that recording is what
the dashboards, the report and replay list per unit. The alert reads it, one instance per job:

    >>> a = Affected("Low", "TrainingLow", "info", {}, UNITS_EXAMPLE, hold=300.0)
    >>> print(a.alert_expr(("training_job",)))
    count by (training_job) (gpu:trainprof_rule_low:affected{severity="info"})
    or on (training_job)
    (
      count by (training_job) (max_over_time(gpu:trainprof_rule_low:affected{severity="info"}[5m]))
      and on (training_job)
      ALERTS{alertname="TrainingLow", alertstate="firing", rule="Low", severity="info"}
    )

Its value is the number of units affected; its description says of how many and names the
worst few, read with the `query` template function when the alert is evaluated (Prometheus
and vmalert both have it), so the label set stays the same while it fires.

The second half of the expression is the hold: a firing alert keeps firing while its
condition held at some evaluation within `hold` seconds (the rule's patience), so noise
shorter than the patience neither resolves it nor fires it again, and a real recovery
resolves it `hold` later. It reads the alert's own `ALERTS` series, which the rule manager
writes at every evaluation (Prometheus, promtool; vmalert through its remote write), so it
works the same in every engine trainprof supports. `keep_firing_for` would say the same,
but vmalert 1.79 refuses the field ("unknown fields in rule: keep_firing_for").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from trainprof.contract.durations import format_duration
from trainprof.contract.names import (
    AFFECTED,
    JOB_LABEL,
    RULE_METRIC_PREFIX,
    record_name,
    rule_metric,
)
from trainprof.rules import promql
from trainprof.rules.catalog._text import JOB
from trainprof.rules.model import Population, Units

# A firing alert holds for at least this many evaluations of its group, so a condition
# flickering at every evaluation does not resolve and fire it again.
HOLD_EVALUATIONS = 5
# Units a description names.
WORST = 3

UNITS_EXAMPLE = Units(
    "gpu",
    "GPU",
    "GPUs",
    "{{ .Labels.node }} GPU {{ .Labels.gpu }}",
    Population("gpu:trainprof_gpu_utilization_sampled_ratio:fraction_below10_rate4m10s"),
    "{{ .Value | humanizePercentage }}",
)


def default_hold(for_seconds: float, patience_seconds: float, evaluation: float) -> float:
    """The rule's patience (`for:` or warm-up), at least HOLD_EVALUATIONS evaluations.

    >>> default_hold(500, 500, 60), default_hold(10, 0, 60), default_hold(0, 10, 2)
    (500, 300, 10)
    """
    return max(for_seconds, patience_seconds, HOLD_EVALUATIONS * evaluation)


@dataclasses.dataclass(frozen=True)
class Affected:
    """A rule alert's recording of what it found, and the one-per-job alert reading it."""

    rule: str
    alertname: str
    severity: str
    labels: Mapping[str, str]  # the alert's own static labels: reason
    units: Units | None  # None: one series per job
    hold: float  # seconds; 0: the alert is not held
    metric: str = ""  # the record name's metric part; default rule_metric(rule)

    @property
    def level(self) -> str:
        return self.units.level if self.units else JOB_LABEL

    @property
    def record(self) -> str:
        return record_name(self.level, self.metric or rule_metric(self.rule), AFFECTED)

    @property
    def static(self) -> dict[str, str]:
        """The labels the recording adds to its series."""
        return {"rule": self.rule, "severity": self.severity, **self.labels}

    def selector(self, *matchers: promql.Matcher) -> str:
        """The recording's series of this alert (its severity and reason)."""
        own = {"severity": self.severity, **self.labels}
        return promql.selector(self.record, matchers, **own)

    def recording(self, expr: str) -> dict:
        return {"record": self.record, "expr": expr, "labels": self.static}

    def alert_expr(self, job_labels: Sequence[str], held: bool = True) -> str:
        """The alert's expression; `held` False leaves the hold out (replay applies it:
        trainprof.replay.cadence.AlertStates)."""
        by = ", ".join(job_labels)
        now = self.selector()
        if self.units is not None:
            now = f"count by ({by}) ({now})"
        if not (self.hold and held):
            return now
        recent = f"max_over_time({self.selector()}[{format_duration(self.hold)}])"
        if self.units is not None:
            recent = f"count by ({by}) ({recent})"
        firing = promql.selector(
            "ALERTS",
            (),
            alertname=self.alertname,
            alertstate="firing",
            rule=self.rule,
            severity=self.severity,
            **self.labels,
        )
        return f"{now}\nor on ({by})\n(\n  {recent}\n  and on ({by})\n  {firing}\n)"

    def description(
        self,
        text: str,
        job_labels: Sequence[str],
        matchers: Sequence[promql.Matcher],
        population: str | None = None,
        named_job: bool = True,
    ) -> str:
        """`text` for a per-job alert; for a per-unit one, "Job j: 5 of 16 GPUs <text>.
        Worst (<value_text>): <unit> at <value>, ...", without "of 16" when the units have no
        population and without the job when not `named_job` (units of no job: a GPU several
        jobs share). `population`: PromQL counting a job's
        units instead of the catalog's (with %[n]q verbs for the job's label values)."""
        units = self.units
        if units is None:
            return text
        args = " ".join(f"$labels.{label}" for label in job_labels)
        job = [f"{label}=%[{i}]q" for i, label in enumerate(job_labels, 1)]
        if population is None and units.population is not None:
            population = count_population(units.population, matchers, job)
        over = "max_over_time" if units.worst == "highest" else "min_over_time"
        pick, order = ("topk", "sort_desc") if units.worst == "highest" else ("bottomk", "sort")
        own = [_verbatim(m.render()) for m in self._own_matchers()]
        recorded = f"{self.record}{{{', '.join(own + job)}}}"
        if self.hold:
            recorded = f"{over}({recorded}[{format_duration(self.hold)}])"
        worst = f"{order}({pick}({WORST}, {recorded}))"
        shown = f"{units.name} at {units.value}" if units.value else units.name
        listed = (
            f"{{{{ range $i, $u := printf `{worst}` {args} | query }}}}"
            f"{{{{ if $i }}}}, {{{{ end }}}}{shown}"
            "{{ else }}none now{{ end }}"
        )
        what = f" ({units.value_text})" if units.value_text else ""
        # Units without a measure (an input missing) are named, not ranked.
        named = f"Worst{what}" if units.value else "Among them"
        if population is None:
            counted = f"{{{{ $value }}}} {units.plural} {_sentence(text)} {named}: {listed}."
            return f"Job {JOB}: {counted}" if named_job else counted
        total = (
            f"{{{{ with printf `{population}` {args} | query }}}}"
            '{{ . | first | value | printf "%.0f" }}{{ else }}?{{ end }}'
        )
        return (
            f"Job {JOB}: {{{{ $value }}}} of {total} {units.plural} {text}. Worst{what}: {listed}."
        )

    def matches(self, rule: Mapping) -> bool:
        """Whether compiled alerting rule `rule` (a dict) is this alert."""
        labels = rule.get("labels", {})
        return rule.get("alert") == self.alertname and all(
            labels.get(k) == v for k, v in self.static.items()
        )

    def _own_matchers(self) -> list[promql.Matcher]:
        own = {"severity": self.severity, **self.labels}
        return [promql.Matcher(k, "=", v) for k, v in own.items()]


def _sentence(text: str) -> str:
    """`text` ending a sentence: a full stop unless it has its own."""
    return text if text.endswith(("?", "!", ".")) else text + "."


def health_metric(alert: str) -> str:
    """The metric part of a health check's recording, from its alert's name.

    >>> health_metric("TrainprofSamplerStalled")
    'trainprof_health_sampler_stalled'
    """
    snake = rule_metric(alert.removeprefix("Trainprof")).removeprefix(RULE_METRIC_PREFIX)
    return "trainprof_health_" + snake


def count_population(
    population: Population, matchers: Sequence[promql.Matcher], job: Sequence[str]
) -> str:
    """PromQL counting a job's units: `job` are matchers already rendered (Go verbs)."""
    parts = [_verbatim(m.render()) for m in matchers]
    parts += [_verbatim(promql.Matcher(k, "=", v).render()) for k, v in population.equal.items()]
    selected = f"{population.series}{{{', '.join([*parts, *job])}}}"
    if population.distinct:
        selected = f"count by ({', '.join(population.distinct)}) ({selected})"
    return f"count({selected})"


def _verbatim(text: str) -> str:
    """PromQL text inside a Go format string: `%` doubled; a backtick cannot appear in a Go
    raw string, so it is written as the escape PromQL reads inside a double-quoted string."""
    return text.replace("%", "%%").replace("`", "\\x60")


def without_holds(
    groups: Sequence[Mapping], affected: Sequence[Affected], job_labels: Sequence[str]
) -> list[dict]:
    """The rule groups with every alert's hold left out, and each hold in seconds by
    (alertname, static labels): replay evaluates the first and applies the second itself
    (trainprof.replay.cadence.AlertStates), since a hold reads the alert's own ALERTS."""
    out = []
    for group in groups:
        rules = []
        for rule in group["rules"]:
            found = next((a for a in affected if "alert" in rule and a.matches(rule)), None)
            if found is not None:
                rule = {**rule, "expr": found.alert_expr(job_labels, held=False)}
            rules.append(rule)
        out.append({**group, "rules": rules})
    return out


def holds(affected: Sequence[Affected]) -> dict[tuple[str, tuple], float]:
    """(alertname, static labels) -> the alert's hold in seconds."""
    return {(a.alertname, tuple(sorted(a.static.items()))): a.hold for a in affected}


# --- what the alerts found, per unit: replay's JSON, the report -----------------------------

# Labels of an `affected` series that say nothing about the unit.
NOT_UNIT = frozenset(("__name__", "rule", "severity"))


@dataclasses.dataclass
class AffectedUnit:
    """One unit (GPU, node, rank, ...) a rule's alert found: its labels (the job's left out,
    `reason` kept), when it was first and last found, and its worst value then."""

    labels: dict[str, str]
    first_at: float
    last_at: float
    worst: float

    def as_json(self) -> dict:
        def number(value: float) -> float | int:
            return int(value) if float(value).is_integer() else round(value, 6)

        return {
            "labels": self.labels,
            "first_at": number(self.first_at),
            "last_at": number(self.last_at),
            "worst": None if self.worst != self.worst else number(self.worst),
        }


def affected_selector(job_matchers: Sequence[str]) -> str:
    """Every rule's `affected` series of one job: `job_matchers` are rendered matchers."""
    return (
        "{" + ", ".join([f'__name__=~".+:{RULE_METRIC_PREFIX}.+:{AFFECTED}"', *job_matchers]) + "}"
    )


def units_found(
    samples: Mapping[float, Sequence[tuple[Mapping[str, str], float]]],
    affected: Sequence[Affected],
    job_labels: Sequence[str],
) -> dict[str, list[AffectedUnit]]:
    """{rule: the units its alerts found}, from the `affected` series' samples by time
    (`affected_selector`'s answers), worst value by each alert's `Units.worst`."""
    lowest = {
        (a.rule, tuple(sorted(a.labels.items())))
        for a in affected
        if a.units is not None and a.units.worst == "lowest"
    }
    units: dict[tuple[str, tuple], AffectedUnit] = {}
    for t in sorted(samples):
        for labels, value in samples[t]:
            rule = labels.get("rule", "")
            kept = {k: v for k, v in labels.items() if k not in NOT_UNIT and k not in job_labels}
            key = (rule, tuple(sorted(kept.items())))
            found = units.get(key)
            if found is None:
                units[key] = AffectedUnit(kept, t, t, value)
                continue
            found.last_at = t
            own = {k: v for k, v in kept.items() if k in ("reason", "affects")}
            if (rule, tuple(sorted(own.items()))) in lowest:
                found.worst = min(found.worst, value)
            else:
                found.worst = max(found.worst, value)
    out: dict[str, list[AffectedUnit]] = {}
    for (rule, _), unit in sorted(units.items(), key=lambda kv: (kv[1].first_at, kv[0][1])):
        out.setdefault(rule, []).append(unit)
    return out

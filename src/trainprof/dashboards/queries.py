"""PromQL for dashboards and the report: selectors narrowed by the dashboard's variables.

A panel query names a contract metric or a recording rule; `Scope.sel` adds the rule
configuration's job selector and one matcher per dashboard variable the series carries
(a node-level series gets no `gpu` matcher, or selecting a GPU would blank it):

    >>> scope = Scope(default_config(), JOB_VARIABLES)
    >>> scope.sel("trainprof_cpu_cores")
    'trainprof_cpu_cores{namespace=~"$namespace", training_job="$training_job", node=~"$node"}'

`interpolate` replaces the variables the way Grafana's Prometheus data source does, so the
report and the tests run exactly the queries a dashboard sends.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from trainprof.contract import metrics as contract
from trainprof.contract.names import AFFECTED, JOB_LABEL, JOB_LABELS
from trainprof.rules.config import RulesConfig, default_config  # noqa: F401 (doctest)
from trainprof.rules.model import RECORD_NAME
from trainprof.rules.promql import Matcher, selector
from trainprof.sources.gauges import gauges_for

JOB_VARIABLES = (*JOB_LABELS, "node", "gpu", "rank")
FLEET_VARIABLES = ("namespace",)
# Variables holding exactly one value are matched with `=`; the others may be "All" (.*)
# or several values, which Grafana writes as a regex.
SINGLE_VALUED = (JOB_LABEL, "job_a", "job_b")  # the job dashboard's, the compare one's
ALERT_SERIES = ("ALERTS", "ALERTS_FOR_STATE")
# The series that say a job exists: one from the exporter, one from the training API.
PRESENCE = (contract.SAMPLES_TOTAL, contract.TRAINING_STEPS_TOTAL)

# Grafana's built-in interval variables.
RATE_INTERVAL = "$__rate_interval"
RANGE = "$__range"


def presence_names(source: tuple[str, ...] = ("trainprof",)) -> tuple[str, ...]:
    """The series whose presence says a job ran: trainprof's, plus the per-job gauges of the
    source adapters a `source` setting names (a cluster without trainprof's exporter).

    >>> presence_names(("node_exporter",))[-1]
    'node_job:trainprof_cpu_utilization:ratio'
    """
    adapters = gauges_for(source)
    extra = [
        adapters[h]
        for h in (
            contract.GPU_UTILIZATION_SAMPLED_RATIO,
            contract.CPU_UTILIZATION_SAMPLED_RATIO,
        )
        if h in adapters
    ]
    return PRESENCE + tuple(extra)


def presence(source: tuple[str, ...] = ("trainprof",)) -> str:
    """A selector of any series of a job, for the variables' queries."""
    return f'{{__name__=~"{"|".join(presence_names(source))}"}}'


def series_labels(
    name: str, job_labels: Sequence[str], exporter_has_job: bool = True
) -> frozenset[str]:
    """Which of the dashboard variables' labels a series carries.

    Recording rules say it in their level (`gpu:` keeps a GPU's labels, `training_job:`
    only the job's); contract metrics in the contract; ALERTS carry at least the job's.
    A node-wide exporter (`gpu_attribution: assignment`) serves no job labels: its series
    and the `gpu:`/`node:` recordings made from them are narrowed by node and GPU only
    (the node variable lists the job's nodes).
    """
    job = frozenset(job_labels) | {JOB_LABEL}
    if name in ALERT_SERIES:
        return job
    if RECORD_NAME.match(name) and name.endswith(":" + AFFECTED):
        # What an alert found (trainprof.rules.job_alerts): always its job's, whatever the
        # exporter serves (the alert counts it per job), and its unit's labels.
        level = name.split(":", 1)[0].split("_")[0]
        return job | {"gpu": {"node", "gpu"}, "node": {"node"}, "rank": {"node", "rank"}}.get(
            level, set()
        )
    if RECORD_NAME.match(name):
        level = name.split(":", 1)[0]
        for prefix, extra in (
            ("gpu", {"node", "gpu"}),
            ("node", {"node"}),
            ("rank", {"node", "rank"}),
            (JOB_LABEL, set()),
        ):
            if level == prefix or level.startswith(prefix + "_"):
                # `gpu_job:`/`node_job:` gauges carry their job whatever the exporter serves.
                if (
                    not exporter_has_job
                    and prefix in ("gpu", "node")
                    and not level.endswith("_job")
                ):
                    return frozenset(extra)
                return job | extra
        raise ValueError(
            f"recording {name}: unknown level {level!r}; say in "
            "dashboards/queries.py which variables narrow it"
        )
    base = re.sub(r"_(bucket|sum|count)$", "", name)
    metric = contract.BY_NAME.get(name) or contract.BY_NAME.get(base)
    if metric is None or name not in contract.series_names(metric):
        raise KeyError(f"{name} is neither a recording rule nor in the metric contract")
    labels = set(job) | {"node"}
    if metric.source != "training" and not exporter_has_job:
        labels = {"node"}
    if metric.source == "training":
        labels.add("rank")
    if "gpu" in metric.labels:
        labels.add("gpu")
    return frozenset(labels)


@dataclasses.dataclass(frozen=True)
class Scope:
    """The rule configuration's job selector plus the dashboard variables in use."""

    config: RulesConfig
    variables: tuple[str, ...]

    def sel(self, series: str, *extra: Matcher, **equal: str) -> str:
        """`series{...}`: job selector, `extra` matchers and fixed `equal` labels, then the
        variables."""
        carried = series_labels(
            series, self.config.job_labels, self.config.gpu_attribution != "assignment"
        )
        matchers = list(self.config.job_selector) + list(extra)
        matchers += [Matcher(k, "=", v) for k, v in equal.items()]
        given = {m.label for m in matchers}
        for name in self.variables:
            if name in carried and name not in given:
                op = "=" if name in SINGLE_VALUED else "=~"
                matchers.append(Matcher(name, op, f"${name}"))
        return selector(series, matchers)

    @property
    def by_job(self) -> str:
        return f"by ({', '.join(self.config.job_labels)})"


def regex_escape(value: str) -> str:
    """A literal value inside a Prometheus regex, as Grafana escapes variable values."""
    return re.sub(r"([\\^$.|?*+()\[\]{}])", r"\\\1", value)


def one_job(training_job: str, namespace: str | None) -> dict[str, str | None]:
    """The variables of the job dashboard set to one job, all its nodes, GPUs and ranks: what
    the report and replay's verdicts interpolate its queries with."""
    return {
        JOB_LABEL: training_job,
        "namespace": namespace,
        "node": None,
        "gpu": None,
        "rank": None,
    }


def interpolate(
    expr: str,
    values: Mapping[str, str | Sequence[str] | None],
    builtins: Mapping[str, str] | None = None,
) -> str:
    """`expr` with `$name` replaced as Grafana's Prometheus data source does.

    A value of None means "All" (`.*`); a list of values becomes `(a|b)`; single-valued
    variables are inserted as they are, the others regex-escaped. Text inserted into a
    double-quoted PromQL string is escaped for it too.
    """

    def one(name: str) -> str:
        value = values.get(name)
        if name in SINGLE_VALUED:
            text = value if isinstance(value, str) else ""
        elif value is None:
            text = ".*"
        elif isinstance(value, str):
            text = regex_escape(value)
        else:
            text = "(" + "|".join(regex_escape(v) for v in value) + ")"
        return text.replace("\\", "\\\\").replace('"', '\\"')

    def replace(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name.startswith("__"):
            if builtins is None or name not in builtins:
                raise KeyError(f"no value for Grafana's ${name}")
            return builtins[name]
        if name not in values:
            raise KeyError(f"no value for the variable ${name}")
        return one(name)

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, expr)

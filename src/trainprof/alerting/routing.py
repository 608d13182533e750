"""Who hears about which trainprof alert, derived from the rule catalog.

The policy, in the words of the monitoring-mixins conventions: `critical` pages (the
bottleneck rules, and a job that never starts), `warning` notifies (a ticket or a chat
message: the advisory rules and trainprof's own health), `info` reaches a low-priority
receiver that discards by default. Routing reads the alert's `severity` label, so a severity
overridden in the rule configuration routes as configured without regenerating anything.

Every trainprof alert is grouped per job (`namespace`, `training_job`): one page says
"job bert-large is CPU- and IO-bottlenecked", not two pages. Inhibitions come from the
catalog's `inhibits` (a job that has not started silences its own host and GPU verdicts; a
bottlenecked job silences the idle-GPU verdicts it explains) plus one convention: a critical
alert silences the warning and info alerts of the same rule and job.

    >>> [r.receiver.removeprefix("trainprof-") for r in tree().routes]
    ['actions', 'page', 'notify', 'info', 'notify', 'page', 'notify', 'info', 'notify']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from trainprof.alerting.model import InhibitRule, Matcher, Route, Timing
from trainprof.contract.names import HEALTH_RULE, JOB_LABEL, JOB_LABELS, STATE_RULE, VERSION_LABEL
from trainprof.rules.catalog import registry
from trainprof.rules.model import FAMILIES, SEVERITIES, RuleSpec

PAGE = "trainprof-page"
NOTIFY = "trainprof-notify"
INFO = "trainprof-info"
ACTIONS = "trainprof-actions"
RECEIVERS = (PAGE, NOTIFY, INFO, ACTIONS)
RECEIVER_BY_SEVERITY = {"critical": PAGE, "warning": NOTIFY, "info": INFO}

# Tickets wait two minutes before their first notification: the bottleneck alerts that
# inhibit them are evaluated by other rule groups, up to one scan interval (60 s by default)
# later, and an inhibition only holds back notifications not yet sent.
DEFAULT_TIMING = {
    "subtree": Timing("1m", "5m", "4h"),
    PAGE: Timing("30s", "5m", "4h"),
    NOTIFY: Timing("2m", "10m", "24h"),
    INFO: Timing("5m", "30m", "24h"),
    # StopTraining waits as long as a ticket, for the same inhibitions; the receiver is
    # idempotent, so hourly repeats are cheap and cover a receiver that was down.
    ACTIONS: Timing("2m", "5m", "1h"),
    "health": Timing("5m", "30m", "24h"),
}


def alerting_rules() -> tuple[RuleSpec, ...]:
    return registry.alerting_rules()


def _any_of(label: str, values: Sequence[str]) -> Matcher:
    if len(values) == 1:
        return Matcher(label, "=", values[0])
    return Matcher(label, "=~", "|".join(values))


def trainprof_rules() -> tuple[str, ...]:
    """Every value of the `rule` label a trainprof alert can carry."""
    return tuple(r.name for r in alerting_rules()) + (HEALTH_RULE, STATE_RULE)


def tree(job_labels: Sequence[str] = JOB_LABELS, timing: dict[str, Timing] | None = None) -> Route:
    """The route subtree: add it as the first child of your root route."""
    timing = {**DEFAULT_TIMING, **(timing or {})}
    by_severity = tuple(
        Route(
            RECEIVER_BY_SEVERITY[s],
            (Matcher("severity", "=", s),),
            timing=timing[RECEIVER_BY_SEVERITY[s]],
            why=f"`{s}` alerts go to {RECEIVER_BY_SEVERITY[s]}",
        )
        for s in reversed(SEVERITIES)
    )
    return Route(
        NOTIFY,
        # Every trainprof alert carries its rule's version: custom rules of a configuration
        # (rules.custom), unknown when this tree is generated, are routed like the catalog's.
        (Matcher(VERSION_LABEL, "=~", ".+"),),
        group_by=tuple(job_labels),
        timing=timing["subtree"],
        why="every trainprof alert (catalog and custom rules), grouped per job",
        routes=(
            Route(
                ACTIONS,
                (Matcher("rule", "!~", f"{HEALTH_RULE}|{STATE_RULE}"),),
                timing=timing[ACTIONS],
                continue_=True,
                why="every rule alert also reaches the StopTraining receiver, which acts "
                "only on the rules its configuration opts into or that carry action=stop",
            ),
            *(
                Route(
                    receiver,
                    (Matcher("notify", "=~", f".*{action.lower()}.*"),),
                    timing=timing[receiver],
                    continue_=True,
                    why=f"a rule configured with SageMaker's {action} action also {does}",
                )
                for receiver, action, does in (
                    (PAGE, "SMS", "pages"),
                    (NOTIFY, "Email", "notifies"),
                )
            ),
            Route(
                INFO,
                (Matcher("rule", "=", STATE_RULE),),
                timing=timing[INFO],
                why="a job's state (not started yet) only exists to inhibit; it "
                "never pages and never reaches StopTraining",
            ),
            Route(
                NOTIFY,
                (Matcher("rule", "=", HEALTH_RULE),),
                group_by=("alertname",),
                timing=timing["health"],
                why="trainprof's own health explains why a rule is silent; one "
                "notification per problem lists every job it affects",
            ),
            *by_severity,
            # The actions route above matched with `continue`, so Alertmanager no longer
            # falls back to this subtree's own receiver: catch the rest explicitly.
            Route(NOTIFY, why="a trainprof alert without a known severity gets a ticket"),
        ),
    )


def family_members(family: str) -> tuple[str, ...]:
    return tuple(r.name for r in alerting_rules() if r.family == family)


def inhibited_by(spec: RuleSpec) -> tuple[str, ...]:
    """Alerting rules that `spec`'s firing alert silences, in catalog order.

    >>> inhibited_by(registry.BY_NAME["CPUBottleneck"])
    ('LowGPUUtilization', 'BatchSize')
    """
    names = set()
    for entry in spec.inhibits:
        names |= set(family_members(entry)) if entry in FAMILIES else {entry}
    names.discard(spec.name)
    return tuple(r.name for r in alerting_rules() if r.name in names)


def _state_inhibitions(job_labels: tuple[str, ...]) -> list[InhibitRule]:
    """A rule's job-state alerts (`RuleSpec.state`) hold back what the rule inhibits."""
    from trainprof.rules.compiler import compile_rules
    from trainprof.rules.config import default_config

    out = []
    for rule in compile_rules(default_config()).rules:
        spec = rule.instance.spec
        if spec.state is None:
            continue
        held = inhibited_by(spec)
        for state in spec.state(rule.build):
            out.append(
                InhibitRule(
                    (Matcher("rule", "=", STATE_RULE), Matcher("alertname", "=", state.alert)),
                    (_any_of("rule", held),),
                    job_labels,
                    why=f"{state.why}: its {', '.join(held)} alerts wait ({spec.name} judges "
                    "the wait)",
                )
            )
    return out


def inhibit_rules(job_labels: Sequence[str] = JOB_LABELS) -> list[InhibitRule]:
    """The catalog's inhibitions, then critical-over-warning-over-info per rule and job.

    Equality is on the job labels only: the inhibiting alerts (the bottleneck ratios and
    MaxInitializationTime) are job-wide, without `node` or `gpu`, and Alertmanager's
    `equal` treats a label absent on one side as different.
    """
    job_labels = tuple(job_labels)
    sources_by_targets: dict[tuple[str, ...], list[str]] = {}
    for spec in alerting_rules():
        targets = inhibited_by(spec)
        if targets:
            sources_by_targets.setdefault(targets, []).append(spec.name)
    out = []
    for targets, sources in sources_by_targets.items():
        out.append(
            InhibitRule(
                (_any_of("rule", sources),),
                (_any_of("rule", targets),),
                job_labels,
                why=f"{' or '.join(sources)} firing for a job silences {', '.join(targets)} "
                "of the same job",
            )
        )
    out += _state_inhibitions(job_labels)
    rules = _any_of("rule", [r.name for r in alerting_rules()])
    ranked = list(reversed(SEVERITIES))  # critical, warning, info
    for i, higher in enumerate(ranked[:-1]):
        lower = ranked[i + 1 :]
        out.append(
            InhibitRule(
                (rules, Matcher("severity", "=", higher)),
                (rules, _any_of("severity", lower)),
                ("rule",) + job_labels,
                why=f"a `{higher}` alert silences `{'`/`'.join(lower)}` alerts of the same rule "
                "and job (tiered thresholds compiled twice)",
            )
        )
    return out


@dataclasses.dataclass(frozen=True)
class RouteCase:
    """An alert's labels and the receivers the policy says it must reach, in tree order."""

    labels: dict[str, str]
    receivers: tuple[str, ...]

    def as_dict(self) -> dict:
        return {"labels": self.labels, "receivers": list(self.receivers)}


def route_cases(compiled_alerts: Iterable[dict]) -> list[RouteCase]:
    """One case per compiled alert and severity, from the policy, not from the tree.

    `compiled_alerts` are the alert rules of a compiled configuration; each distinct label
    set is tried with every severity (users may override a rule's severity), and once
    without one.
    """
    cases, seen = [], set()
    job = {"namespace": "team-a", JOB_LABEL: "bert-large"}
    for alert in compiled_alerts:
        labels = {"alertname": alert["alert"], **alert["labels"], **job}
        key = tuple(sorted(labels.items()))
        if key in seen:
            continue
        seen.add(key)
        if labels["rule"] == HEALTH_RULE:
            cases.append(RouteCase(labels, (NOTIFY,)))
            continue
        if labels["rule"] == STATE_RULE:
            cases.append(RouteCase(labels, (INFO,)))
            continue
        for severity in reversed(SEVERITIES):
            cases.append(
                RouteCase(
                    {**labels, "severity": severity}, (ACTIONS, RECEIVER_BY_SEVERITY[severity])
                )
            )
        unlabelled = {k: v for k, v in labels.items() if k != "severity"}
        cases.append(RouteCase(unlabelled, (ACTIONS, NOTIFY)))
    return cases

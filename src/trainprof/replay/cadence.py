"""Alerts evaluated at their own group's interval, when promtool evaluates every group faster,
and held through noise as the compiled rules hold them.

promtool's unit tests evaluate every group at one `evaluation_interval`. Rules compiled for
dcgm-exporter or node_exporter start with a `trainprof.sources` group evaluated every scrape
(15 s), while the alert groups keep their 1 m interval, as Prometheus evaluates them live.
Run at 15 s, an alert's `for:` would start counting up to 45 s earlier than live and its
firing time would have 15 s resolution. So replay asks promtool which alerts are active
(pending or firing: their condition holds) at every evaluation, and replays each slower
group's alerts from those states at that group's own times, `for:` included, as
Prometheus' rule manager does (a condition that stops holding resets the alert).

    >>> groups = [{"name": "g", "interval": "1m",
    ...            "rules": [{"alert": "Low", "expr": "x < 1", "for": "2m"}]}]
    >>> active = {t: [{"alertname": "Low"}] for t in range(15, 300, 15)}
    >>> slow = SlowAlerts(groups, evaluation=15)
    >>> firing = slow.firing(active, end=300)
    >>> min(t for t, alerts in firing.items() if alerts)
    180

A compiled alert holds while it fired at its group's previous evaluation and its condition
held at some evaluation within its hold (trainprof.rules.job_alerts): it reads its own
ALERTS for that, which would make a chunk's state depend on the whole job before it. So
replay evaluates the alerts without their hold and `AlertStates` applies it, with `for:`,
to every alert from its condition at each evaluation, as the rule manager does:

    >>> states = AlertStates(groups, evaluation=60, holds={("Low", ()): 120})
    >>> cond = {t: [{"alertname": "Low"}] for t in (60, 120, 180, 300, 540)}
    >>> sorted(t for t, alerts in states.firing(cond, end=660).items() if alerts)
    [180, 240, 300, 360, 420]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from trainprof.contract.durations import parse_duration

Labels = dict[str, str]


class AlertStates:
    """Every alerting rule's firing alerts, replayed from their conditions: at the rule's own
    group interval (`only_slower`: only the groups slower than `evaluation`), with `for:` and
    its hold (`holds`: (alertname, static labels) -> seconds; none by default)."""

    def __init__(
        self,
        groups: Iterable[Mapping],
        evaluation: float,
        holds: Mapping[tuple[str, tuple], float] | None = None,
        only_slower: bool = False,
    ):
        self.evaluation = evaluation
        # (alertname, static labels, interval, for, hold) of each alerting rule replayed
        self.rules: list[tuple[str, dict[str, str], float, float, float]] = []
        holds = holds or {}
        for group in groups:
            interval = parse_duration(group.get("interval", "1m"))
            if only_slower and interval <= evaluation + 1e-9:
                continue
            for rule in group["rules"]:
                if "alert" in rule:
                    static = dict(rule.get("labels", {}))
                    self.rules.append(
                        (
                            rule["alert"],
                            static,
                            interval,
                            parse_duration(rule.get("for", "0s")),
                            _hold_of(holds, rule["alert"], static),
                        )
                    )

    def __bool__(self) -> bool:
        return bool(self.rules)

    def times(self, end: float) -> list[float]:
        """When the slower groups evaluate, up to `end`: the only times their alerts'
        states are needed.

        >>> SlowAlerts([{"name": "g", "interval": "1m", "rules": [{"alert": "A", "expr": "1"}]}],
        ...            evaluation=15).times(150)
        [60, 120]
        """
        steps = int(round(end / self.evaluation))
        out = []
        for k in range(1, steps + 1):
            t = round(k * self.evaluation, 6)
            if any(_on_grid(t, interval) for _, _, interval, _, _ in self.rules):
                out.append(t)
        return out

    def rule_of(self, labels: Mapping[str, str]) -> tuple[float, float] | None:
        """(interval, for) of the replayed rule an alert's labels belong to, else None."""
        found = self._rule(labels)
        return None if found is None else found[:2]

    def _rule(self, labels: Mapping[str, str]) -> tuple[float, float, float] | None:
        for name, static, interval, wait, hold in self.rules:
            if labels.get("alertname") == name and all(
                labels.get(k) == v for k, v in static.items()
            ):
                return interval, wait, hold
        return None

    def firing(self, active: Mapping[float, list[Labels]], end: float) -> dict[float, list[Labels]]:
        """{evaluation time: firing alerts of the replayed rules}, from each time's active
        alerts (those whose condition holds, pending or firing); a firing alert stays listed
        until its group's next evaluation."""
        rules: dict[tuple, tuple[float, float, float]] = {}  # key -> interval, for, hold
        for t in sorted(active):
            for labels in active[t]:
                key = _key(labels)
                if key not in rules:
                    found = self._rule(labels)
                    if found is not None:
                        rules[key] = found
        since: dict[tuple, float | None] = dict.fromkeys(rules)  # when it became active
        last: dict[tuple, float | None] = dict.fromkeys(rules)  # its condition's last time
        now: dict[tuple, bool] = {}
        out: dict[float, list[Labels]] = {}
        steps = int(round(end / self.evaluation))
        for k in range(0 if 0 in active else 1, steps + 1):
            t = round(k * self.evaluation, 6)
            present = {_key(lb) for lb in active.get(t, [])}
            for key, (interval, wait, hold) in rules.items():
                if not _on_grid(t, interval):
                    continue  # the group is not evaluated now: the alert keeps its state
                if key in present:
                    last[key] = t
                seen = last[key]
                held = now.get(key, False) and seen is not None and t - seen <= hold + 1e-6
                if key in present or held:
                    since[key] = t if since[key] is None else since[key]
                    now[key] = t - since[key] >= wait - 1e-9  # type: ignore[operator]
                else:
                    since[key], now[key] = None, False
            out[t] = [
                {**dict(key), "alertstate": "firing"} for key, firing in now.items() if firing
            ]
        return out


def SlowAlerts(groups: Iterable[Mapping], evaluation: float) -> AlertStates:  # noqa: N802
    """The alerting rules of groups evaluated less often than every `evaluation` seconds."""
    return AlertStates(groups, evaluation, only_slower=True)


def _hold_of(holds: Mapping[tuple[str, tuple], float], alert: str, static: dict) -> float:
    """The hold of the alert rule named `alert` with `static` labels: the entry whose
    labels it carries."""
    for (name, labels), seconds in holds.items():
        if name == alert and all(static.get(k) == v for k, v in labels):
            return seconds
    return 0.0


def _key(labels: Mapping[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in ("__name__", "alertstate")))


def _on_grid(t: float, interval: float) -> bool:
    ratio = t / interval
    return abs(ratio - round(ratio)) < 1e-6

"""Alerts evaluated at their own group's interval, when promtool evaluates every group faster.

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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from trainprof.contract.durations import parse_duration

Labels = dict[str, str]


class SlowAlerts:
    """The alerting rules of groups evaluated less often than every `evaluation` seconds."""

    def __init__(self, groups: Iterable[Mapping], evaluation: float):
        self.evaluation = evaluation
        # (alertname, static labels, interval, for) of each slower alerting rule
        self.rules: list[tuple[str, dict[str, str], float, float]] = []
        for group in groups:
            interval = parse_duration(group.get("interval", "1m"))
            if interval <= evaluation + 1e-9:
                continue
            for rule in group["rules"]:
                if "alert" in rule:
                    self.rules.append(
                        (
                            rule["alert"],
                            dict(rule.get("labels", {})),
                            interval,
                            parse_duration(rule.get("for", "0s")),
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
            if any(_on_grid(t, interval) for _, _, interval, _ in self.rules):
                out.append(t)
        return out

    def rule_of(self, labels: Mapping[str, str]) -> tuple[float, float] | None:
        """(interval, for) of the slower rule an alert's labels belong to, else None."""
        for name, static, interval, hold in self.rules:
            if labels.get("alertname") == name and all(
                labels.get(k) == v for k, v in static.items()
            ):
                return interval, hold
        return None

    def firing(self, active: Mapping[float, list[Labels]], end: float) -> dict[float, list[Labels]]:
        """{evaluation time: firing alerts of the slower rules}, from each time's active
        alerts; a firing alert stays listed until its group's next evaluation."""
        states: dict[tuple, tuple[float, float, float | None]] = {}  # key -> interval, for, since
        for t in sorted(active):
            for labels in active[t]:
                key = _key(labels)
                if key not in states:
                    found = self.rule_of(labels)
                    if found is not None:
                        states[key] = (*found, None)
        out: dict[float, list[Labels]] = {}
        steps = int(round(end / self.evaluation))
        now: dict[tuple, bool] = {}
        for k in range(1, steps + 1):
            t = round(k * self.evaluation, 6)
            present = {_key(lb) for lb in active.get(t, [])}
            for key, (interval, hold, since) in states.items():
                if not _on_grid(t, interval):
                    continue  # the group is not evaluated now: the alert keeps its state
                if key in present:
                    since = t if since is None else since
                    now[key] = t - since >= hold - 1e-9
                else:
                    since, now[key] = None, False
                states[key] = (interval, hold, since)
            out[t] = [
                {**dict(key), "alertstate": "firing"} for key, firing in now.items() if firing
            ]
        return out


def _key(labels: Mapping[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in ("__name__", "alertstate")))


def _on_grid(t: float, interval: float) -> bool:
    ratio = t / interval
    return abs(ratio - round(ratio)) < 1e-6

"""Routes and inhibit rules, written as Alertmanager configuration or as an AlertmanagerConfig.

One model, two spellings, so the plain configuration and the prometheus-operator resource
cannot disagree:

    >>> route = Route("trainprof-page", (Matcher("severity", "=", "critical"),))
    >>> route.as_config()
    {'receiver': 'trainprof-page', 'matchers': ['severity="critical"']}
    >>> route.as_resource()["matchers"]
    [{'name': 'severity', 'matchType': '=', 'value': 'critical'}]
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

OPERATORS = ("=", "!=", "=~", "!~")


@dataclasses.dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str

    def __post_init__(self):
        if self.op not in OPERATORS:
            raise ValueError(f"matcher operator {self.op!r} is not one of {', '.join(OPERATORS)}")

    def __str__(self) -> str:
        # Alertmanager's matcher syntax takes Go-style double-quoted strings; JSON's escaping
        # of quotes, backslashes and newlines is the same.
        return f"{self.label}{self.op}{json.dumps(self.value)}"

    def as_resource(self) -> dict[str, str]:
        return {"name": self.label, "matchType": self.op, "value": self.value}


@dataclasses.dataclass(frozen=True)
class Timing:
    """How long Alertmanager waits before the first notification of a group, between
    notifications of a changing group, and before repeating an unchanged one."""

    group_wait: str
    group_interval: str
    repeat_interval: str


@dataclasses.dataclass(frozen=True)
class Route:
    receiver: str
    matchers: tuple[Matcher, ...] = ()
    group_by: tuple[str, ...] = ()
    timing: Timing | None = None
    continue_: bool = False
    routes: tuple[Route, ...] = ()
    why: str = ""  # for the docs; not written to the configuration

    def as_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {"receiver": self.receiver}
        if self.matchers:
            out["matchers"] = [str(m) for m in self.matchers]
        if self.group_by:
            out["group_by"] = list(self.group_by)
        if self.timing:
            out.update(dataclasses.asdict(self.timing))
        if self.continue_:
            out["continue"] = True
        if self.routes:
            out["routes"] = [r.as_config() for r in self.routes]
        return out

    def as_resource(self) -> dict[str, Any]:
        out: dict[str, Any] = {"receiver": self.receiver}
        if self.matchers:
            out["matchers"] = [m.as_resource() for m in self.matchers]
        if self.group_by:
            out["groupBy"] = list(self.group_by)
        if self.timing:
            out["groupWait"] = self.timing.group_wait
            out["groupInterval"] = self.timing.group_interval
            out["repeatInterval"] = self.timing.repeat_interval
        if self.continue_:
            out["continue"] = True
        if self.routes:
            out["routes"] = [r.as_resource() for r in self.routes]
        return out

    def receivers(self) -> list[str]:
        """Every receiver named in this tree, in order, each once."""
        names = [self.receiver]
        for route in self.routes:
            names += [n for n in route.receivers() if n not in names]
        return names


@dataclasses.dataclass(frozen=True)
class InhibitRule:
    source: tuple[Matcher, ...]
    target: tuple[Matcher, ...]
    equal: tuple[str, ...]
    why: str = ""  # for the docs

    def as_config(self) -> dict[str, Any]:
        return {
            "source_matchers": [str(m) for m in self.source],
            "target_matchers": [str(m) for m in self.target],
            "equal": list(self.equal),
        }

    def as_resource(self) -> dict[str, Any]:
        return {
            "sourceMatch": [m.as_resource() for m in self.source],
            "targetMatch": [m.as_resource() for m in self.target],
            "equal": list(self.equal),
        }

"""Alertmanager's webhook payload (version 4), read strictly.

    {"version": "4", "status": "firing", "receiver": "trainprof-actions",
     "groupKey": "...", "groupLabels": {...}, "commonLabels": {...}, "externalURL": "...",
     "alerts": [{"status": "firing", "labels": {"alertname": "TrainingCPUBottleneck", ...},
                 "annotations": {...}, "startsAt": "2026-11-22T01:38:32.606Z",
                 "endsAt": "0001-01-01T00:00:00Z", "fingerprint": "99f81360aa0d5ea5", ...}]}

Only what the receiver relies on is checked; a payload that fails raises PayloadError with
the reason, which the server answers with 422.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

_FINGERPRINT = re.compile(r"^[0-9a-f]{1,32}$")
# RFC 3339 as Alertmanager writes it (Go's time.Time), fractional seconds optional.
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)$")
MAX_ALERTS = 1000


class PayloadError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Alert:
    status: str  # firing | resolved
    labels: Mapping[str, str]
    starts_at: str
    fingerprint: str

    @property
    def key(self) -> tuple[str, str]:
        """One firing of one alert: Alertmanager keeps both while it fires."""
        return self.fingerprint, self.starts_at


def parse(data: Any) -> list[Alert]:
    if not isinstance(data, Mapping):
        raise PayloadError("expected a JSON object")
    if data.get("version") != "4":
        raise PayloadError(
            f'expected Alertmanager\'s webhook version "4", got {str(data.get("version"))[:20]!r}'
        )
    alerts = data.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("`alerts` is not a list")
    if len(alerts) > MAX_ALERTS:
        raise PayloadError(f"more than {MAX_ALERTS} alerts in one request")
    return [_alert(i, a) for i, a in enumerate(alerts)]


def _alert(i: int, raw: Any) -> Alert:
    where = f"alerts[{i}]"
    if not isinstance(raw, Mapping):
        raise PayloadError(f"{where} is not an object")
    status = raw.get("status")
    if status not in ("firing", "resolved"):
        raise PayloadError(f"{where}.status is not firing or resolved")
    labels = raw.get("labels")
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise PayloadError(f"{where}.labels is not an object of strings")
    starts_at = raw.get("startsAt")
    if not isinstance(starts_at, str) or not _TIMESTAMP.match(starts_at):
        raise PayloadError(f"{where}.startsAt is not an RFC 3339 time")
    fingerprint = raw.get("fingerprint")
    if not isinstance(fingerprint, str) or not _FINGERPRINT.match(fingerprint):
        raise PayloadError(f"{where}.fingerprint is not a hexadecimal fingerprint")
    return Alert(status, dict(labels), starts_at, fingerprint)

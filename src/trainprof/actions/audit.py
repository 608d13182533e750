"""The audit log: one JSON object per line for every request and every decision.

    {"event": "request", "request_id": "5f0c...", "remote": "10.1.2.3", "status": 200, ...}
    {"event": "decision", "request_id": "5f0c...", "decision": "stopped",
     "reason": "PATCH /apis/batch/v1/namespaces/team-a/jobs/bert-large: 200",
     "rule": "CPUBottleneck", "namespace": "team-a", "training_job": "bert-large",
     "target": "Job team-a/bert-large", "fingerprint": "99f81360aa0d5ea5",
     "starts_at": "2026-11-22T01:38:32.606Z", "dry_run": false,
     "time": "2026-11-22T01:40:33.011Z", "ts": 1795232433.011}

Label values are JSON strings (a newline in a label cannot start a forged line) and cut at
256 characters. The bearer token is never written.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, TextIO

MAX_VALUE = 256


def _short(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_VALUE:
        return value[:MAX_VALUE] + "..."
    return value


class AuditLog:
    def __init__(self, path: str = "-", clock=time.time):
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._own = path != "-"
        self._out: TextIO = (
            open(path, "a", encoding="utf-8", buffering=1) if self._own else sys.stdout
        )

    def write(self, event: str, **fields: Any) -> None:
        now = self._clock()
        stamp = datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
        record = {
            "event": event,
            **{k: _short(v) for k, v in fields.items()},
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "ts": round(now, 3),
        }
        line = json.dumps(record, ensure_ascii=True, sort_keys=False)
        with self._lock:
            self._out.write(line + "\n")
            self._out.flush()

    def close(self) -> None:
        if self._own:
            self._out.close()


def history(path: str) -> Iterator[dict]:
    """Records of an existing audit log (none for "-" or a missing file); bad lines skipped."""
    if path == "-" or not os.path.exists(path):
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record

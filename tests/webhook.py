"""Alertmanager webhook payloads for the receiver's tests, and a client that posts them.

The payloads start from `fixtures/webhook-v4-starved.json`, captured from Alertmanager 0.25
in the end-to-end test.
"""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from pathlib import Path

TOKEN = "s3cret-token-0123456789abcdef"
FIXTURE = Path(__file__).parent / "fixtures" / "webhook-v4-starved.json"


def payload(*label_changes: dict, status: str = "firing") -> dict:
    """The captured payload, one alert per entry of `label_changes` (default: its first)."""
    data = json.loads(FIXTURE.read_text())
    template = data["alerts"][0]
    data["alerts"] = []
    for i, changes in enumerate(label_changes or ({},)):
        alert = copy.deepcopy(template)
        alert["labels"].update(changes)
        alert["labels"] = {k: v for k, v in alert["labels"].items() if v is not None}
        alert["status"] = status
        alert["fingerprint"] = f"{int(template['fingerprint'], 16) + i:016x}"
        data["alerts"].append(alert)
    data["status"] = status
    return data


def post(
    url: str,
    body,
    token: str | None = TOKEN,
    content_type="application/json",
    path="/alerts",
    headers=None,
):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, method="POST")
    request.add_header("Content-Type", content_type)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    for k, v in (headers or {}).items():
        request.add_header(k, v)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        with e:
            return e.code, dict(e.headers), json.loads(e.read())

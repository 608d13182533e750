"""The hold that keeps a firing alert through noise, on a live vmalert 1.79 (which refuses
`keep_firing_for`): the compiled alert reads its own ALERTS series back from
VictoriaMetrics, so a condition flickering faster than the hold keeps one alert firing, and
the same rule without the hold flaps.

vmalert's replay mode (tests/test_vmalert_scenarios.py) evaluates a rule over the whole
range in one query, before any of its ALERTS exist, so it cannot hold; this test runs vmalert
live, at a 2 s evaluation interval (hold: 5 evaluations = 10 s), for 80 seconds.
"""

from __future__ import annotations

import collections
import copy
import json
import time
import urllib.request

from trainprof.engines.localstack import victoria_metrics, vmalert
from trainprof.generation.render import to_yaml
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config

from servers import webhook_sink

LABELS = 'job="train", instance="n1:9946", namespace="ml", training_job="bert", rank="0"'
SERIES = (
    f'trainprof_tensor_mean_abs{{{LABELS}, collection="gradients", tensor="", aggregate="min"}}'
)
# AllZero, one alert for the job's collections: its description's `query` templates.
ZEROS = {
    f'trainprof_tensor_zero_ratio{{{LABELS}, collection="{c}", tensor="", aggregate="max"}}': v
    for c, v in (("weights", 1.0), ("gradients", 0.2))
}
BAD, GOOD = 1e-9, 1e-3  # below and above VanishingGradient's threshold 1e-7


def _value(t: float) -> float:
    """Vanished for 30 s (vmalert and VictoriaMetrics take up to 20 s to see a new series
    and its first ALERTS), then flickering (3 s vanished, 3 s not) for 24 s, then healthy."""
    if t < 30:
        return BAD
    if t < 54:
        return BAD if int((t - 30) // 3) % 2 == 0 else GOOD
    return GOOD


def _rules() -> str:
    fast = {"scan_interval_us": 2_000_000}
    config = load_config(
        {
            "rules": [
                {"rule": "VanishingGradient", "parameters": fast},
                {"rule": "AllZero", "parameters": fast},
            ]
        }
    )
    groups = compile_rules(config).groups
    zeros = next(g for g in groups if g["name"] == "trainprof.AllZero")
    group = next(g for g in groups if g["name"] == "trainprof.VanishingGradient")
    # The same rule without its hold, under another name: what vmalert did before.
    control = copy.deepcopy(group)
    control["name"] = "control.VanishingGradient"
    for rule in control["rules"]:
        if "alert" in rule:
            rule["alert"] = "ControlNoHold"
            rule["expr"] = rule["expr"].split("\nor on (")[0]
        rule.pop("annotations", None)
    return to_yaml({"groups": [group, control, zeros]})


def _push(vm: str, value: float) -> None:
    ms = int(time.time() * 1000)
    lines = [f"{SERIES} {value!r} {ms}"] + [f"{s} {v!r} {ms}" for s, v in ZEROS.items()]
    body = ("\n".join(lines) + "\n").encode()
    request = urllib.request.Request(f"{vm}/api/v1/import/prometheus", data=body, method="POST")
    with urllib.request.urlopen(request, timeout=10):
        pass


def _alerts(vmalert_url: str) -> list[dict]:
    with urllib.request.urlopen(f"{vmalert_url}/api/v1/alerts", timeout=10) as response:
        return json.loads(response.read())["data"]["alerts"] or []


def _firing(vmalert_url: str) -> set[str]:
    return {a["labels"]["alertname"] for a in _alerts(vmalert_url) if a["state"] == "firing"}


def test_live_vmalert_holds_a_flickering_alert_and_resolves_it_after(
    victoria_metrics_bin, vmalert_bin, tmp_path
):
    with (
        victoria_metrics(victoria_metrics_bin, tmp_path) as vm,
        webhook_sink() as (notifier, _),
        vmalert(vmalert_bin, tmp_path, {"rules.yaml": _rules()}, vm, notifier, "2s") as va,
    ):
        start = time.time()
        states: list[tuple[float, set[str]]] = []
        while (t := time.time() - start) < 80:
            _push(vm, _value(t))
            states.append((t, _firing(va)))
            time.sleep(0.5)
        zeros = [a for a in _alerts(va) if a["labels"]["alertname"] == "TrainingAllZero"]
    timeline = " ".join(
        f"{t:.0f}:{'H' if 'TrainingVanishingGradient' in now else '-'}"
        f"{'C' if 'ControlNoHold' in now else '-'}"
        for t, now in states
    )
    edges = collections.Counter()
    before: set[str] = set()
    for _, now in states:
        for name in now - before:
            edges[name] += 1
        before = now
    held = [now for t, now in states if 30 <= t <= 56]
    assert all("TrainingVanishingGradient" in now for now in held), timeline
    assert edges["TrainingVanishingGradient"] == 1, timeline
    # Healthy from 54 s: resolved once the 10 s hold has passed (and vmalert's lag).
    assert "TrainingVanishingGradient" not in states[-1][1], timeline
    # Without the hold, the same condition resolves and fires again with the flicker.
    assert edges["ControlNoHold"] >= 2, timeline
    # vmalert renders the per-unit description with its own `query` template function.
    assert [a["annotations"]["description"] for a in zeros] == [
        "Job bert: 1 of 2 collections held a tensor that is at least 100% zeros. "
        "Worst (share of zeros): weights at 100%."
    ]

"""Every catalog alert has promtool scenarios that fire and that stay quiet, with the
default parameters and with overridden ones."""

from __future__ import annotations

import pytest

from trainprof.names import alert_name
from trainprof.rules import catalog

from scenario import load_cases


def _kinds(rule: str) -> set[tuple[str, str]]:
    kinds = set()
    for _, case in load_cases():
        params = "overridden" if "config" in case else "default"
        for e in case.get("expect", []):
            if e.get("alertname", alert_name(case["rule"])) == alert_name(rule):
                kinds.add((params, "fires" if e["alerts"] else "quiet"))
                for a in e["alerts"]:
                    if "reason" in a:
                        kinds.add((params, f"fires:{a['reason']}"))
    return kinds


@pytest.mark.parametrize("rule", [r.name for r in catalog.alerting_rules()])
def test_each_alert_fires_and_stays_quiet_with_default_and_overridden_parameters(rule):
    missing = {(p, k) for p in ("default", "overridden") for k in ("fires", "quiet")} - _kinds(rule)
    assert not missing, f"{rule} has no scenario for {sorted(missing)} in tests/scenarios"


def test_both_lowgpuutilization_reasons_fire_in_some_scenario():
    kinds = _kinds("LowGPUUtilization")
    assert {("default", "fires:underutilized"), ("default", "fires:fluctuating")} <= kinds


def test_non_alerting_rules_pin_their_recordings():
    for rule in catalog.CATALOG:
        if not rule.alerting:
            cases = [c for _, c in load_cases() if c["rule"] == rule.name]
            assert any(c.get("values") for c in cases), f"{rule.name} has no values scenario"

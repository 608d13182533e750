"""Every catalog alert has promtool scenarios that fire and that stay quiet, with the
default parameters and with overridden ones."""

from __future__ import annotations

import pytest

from trainprof.contract.names import alert_name
from trainprof.rules import catalog

from scenario import load_cases


def _overrides(case: dict) -> bool:
    """A case's configuration overrides parameters. Naming rules ProfilerReport leaves out
    (the tensor and regression rules) with none is their defaults: they are not in the
    default configuration, so their cases must name them."""
    config = case.get("config")
    if config is None:
        return False
    rules = config.get("rules") if isinstance(config, dict) else None
    plain = isinstance(rules, list) and all(
        isinstance(r, dict)
        and set(r) == {"rule"}
        and catalog.lookup(str(r["rule"])) not in catalog.profiler_rules()
        for r in rules
    )
    return not plain


def _kinds(rule: str) -> set[tuple[str, str]]:
    kinds = set()
    for _, case in load_cases():
        params = "overridden" if _overrides(case) else "default"
        for e in case.get("expect", []):
            if e.get("alertname", alert_name(case["rule"])) == alert_name(rule):
                kinds.add((params, "fires" if e["alerts"] else "quiet"))
                for a in e["alerts"]:
                    if "reason" in a:
                        kinds.add((params, f"fires:{a['reason']}"))
    return kinds


def _has_defaults(rule: str) -> bool:
    """False for rules whose defaults their own check refuses (TensorVariance needs a
    threshold): they have no default scenario, and test_config pins the refusal."""
    spec = catalog.lookup(rule)
    return not (spec.check and spec.check(spec.values(spec.defaults())))


@pytest.mark.parametrize("rule", [r.name for r in catalog.alerting_rules()])
def test_each_alert_fires_and_stays_quiet_with_default_and_overridden_parameters(rule):
    kinds = ("default", "overridden") if _has_defaults(rule) else ("overridden",)
    missing = {(p, k) for p in kinds for k in ("fires", "quiet")} - _kinds(rule)
    assert not missing, f"{rule} has no scenario for {sorted(missing)} in tests/scenarios"


def test_both_lowgpuutilization_reasons_fire_in_some_scenario():
    kinds = _kinds("LowGPUUtilization")
    assert {("default", "fires:underutilized"), ("default", "fires:fluctuating")} <= kinds


def test_non_alerting_rules_pin_their_recordings():
    for rule in catalog.CATALOG:
        if not rule.alerting:
            cases = [c for _, c in load_cases() if c["rule"] == rule.name]
            assert any(c.get("values") for c in cases), f"{rule.name} has no values scenario"

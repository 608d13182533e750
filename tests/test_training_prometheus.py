"""A real Prometheus scrapes a training rank; the committed rules' expressions read its series."""

from __future__ import annotations

import time

import pytest
import yaml

import trainprof

from servers import prometheus, query

SPIKES = 11  # one more than StepOutlier's default n_outliers


@pytest.fixture(autouse=True)
def fresh_session():
    trainprof.stop()
    yield
    trainprof.stop()


def rule_expr(root, name: str) -> str:
    groups = yaml.safe_load((root / "rules" / "trainprof.rules.yaml").read_text())["groups"]
    for group in groups:
        for rule in group["rules"]:
            if name in (rule.get("record"), rule.get("alert")):
                return rule["expr"]
    raise KeyError(name)


def results(base: str, expr: str) -> list[dict]:
    body = query(base, expr)
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for(base: str, expr: str, timeout: float = 30) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = results(base, expr)
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"{expr} returned nothing within {timeout}s")


def test_rules_read_the_series_a_training_rank_serves(prometheus_bin, tmp_path, root):
    session = trainprof.start(port=0, addr="127.0.0.1", training_job="e2e", rank=0, local_rank=0)
    for _ in trainprof.data(range(200)):
        with trainprof.step():
            with trainprof.phase("forward"):
                pass
    for _ in range(SPIKES):
        with trainprof.step():
            with trainprof.phase("checkpoint"):
                time.sleep(0.1)
    config = f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: train
    static_configs: [{{targets: ["127.0.0.1:{session.port}"]}}]
"""
    with prometheus(prometheus_bin, tmp_path, config, {}) as base:
        wait_for(base, 'trainprof_training_steps_total{training_job="e2e"}')

        # The alerts' conditions, as their `affected` recordings write them (one series
        # per rank and mode; the alert counts them per job).
        (alert,) = results(base, rule_expr(root, "rank_mode:trainprof_rule_step_outlier:affected"))
        assert alert["metric"]["training_job"] == "e2e" and alert["metric"]["mode"] == "train"
        assert float(alert["value"][1]) >= SPIKES

        initializing = "training_job:trainprof_rule_max_initialization_time:affected"
        assert results(base, rule_expr(root, initializing)) == []

        shares = results(base, rule_expr(root, "rank_phase:trainprof_training_phase_seconds:ratio"))
        by_phase = {r["metric"]["phase"]: float(r["value"][1]) for r in shares}
        assert sum(by_phase.values()) == pytest.approx(1.0)
        assert by_phase["checkpoint"] > 0.5

        (mean,) = results(
            base, rule_expr(root, "rank_mode:trainprof_training_step_duration_seconds:mean")
        )
        assert 0 < float(mean["value"][1]) < 0.1

        (init,) = results(
            base, rule_expr(root, "training_job:trainprof_training_initialization_seconds:min")
        )
        assert float(init["value"][1]) > 0

        labels = results(base, "{__name__=~'trainprof_.*'}")
        assert not any(k.startswith("exported_") for r in labels for k in r["metric"])

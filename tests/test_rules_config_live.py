"""One rule configuration drives both sides, live: a real Prometheus evaluates the rules compiled
from it, and a torch training loop on CPU reads it from TRAINPROF_RULES_CONFIG.

The loop trains a linear classifier on noisy mini-batches (its per-batch train loss goes up and
down) and logs the validation loss every 5 steps; from step 40 the learning rate is 0, so the
validation loss stops decreasing there. LossNotDecreasing with num_steps 20 (not the process's
default 10) fires at the first evaluation that sees the plateau, step 60, and not before (the
noisy train loss would fire at once: SageMaker judges the validation loss when there is one),
then stays firing. Without the configuration the process computes num_steps 10 only, and
TrainprofRuleInputMissing says so.
"""

from __future__ import annotations

import time

import pytest
import torch

import trainprof
from trainprof.contract.names import INPUT_MISSING_ALERT, alert_name
from trainprof.generation.render import to_yaml
from trainprof.rules.compiler import HEALTH_GROUP, compile_rules
from trainprof.rules.files import read_config

from servers import get_json, prometheus, wait_for, wait_for_targets

pytestmark = pytest.mark.tools

CONFIG = """\
rules:
  - rule: LossNotDecreasing
    parameters: {num_steps: 20, diff_percent: 1, scan_interval_us: 1000000}
"""
PLATEAU_FROM = 40  # the first step whose update is lost (lr 0)
STEP_SECONDS = 0.2


@pytest.fixture(autouse=True)
def fresh_session(monkeypatch):
    monkeypatch.delenv("TRAINPROF_RULES_CONFIG", raising=False)
    trainprof.stop()
    yield
    trainprof.stop()


def _rules(path) -> str:
    """The compiled rules; the health group at test speed (1 s, `for` 2 s instead of 5 m, and
    the hold through noise, which reads the alert's own ALERTS over its patience, 2 s too)."""
    groups = compile_rules(read_config(str(path))).groups
    for g in groups:
        if g["name"] == HEALTH_GROUP:
            g["interval"] = "1s"
            for rule in g["rules"]:
                if "alert" in rule:  # the group also records what its alerts found
                    rule["for"] = "2s"
                    rule["expr"] = rule["expr"].replace("[5m])", "[2s])")
    return to_yaml({"groups": groups})


def _prometheus_config(port: int) -> str:
    return f"""
global: {{scrape_interval: 500ms, evaluation_interval: 500ms}}
rule_files: [rules.yaml]
scrape_configs:
  - job_name: train
    static_configs: [{{targets: ["127.0.0.1:{port}"]}}]
"""


def _train(steps: int) -> dict[int, float]:
    """The loop; returns the wall time each validation loss was logged at, by step."""
    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = (x @ torch.randn(8) + 0.5 * torch.randn(512) > 0).long()
    x_valid, y_valid, x_train, y_train = x[:128], y[:128], x[128:], y[128:]
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = torch.Generator().manual_seed(1)
    logged = {}
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = 0.05 if step < PLATEAU_FROM else 0.0
        index = torch.randint(0, len(x_train), (16,), generator=batches)
        loss = torch.nn.functional.cross_entropy(model(x_train[index]), y_train[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        trainprof.log_loss(loss)  # per batch: noisy
        if step % 5 == 0:
            with torch.no_grad():
                valid = torch.nn.functional.cross_entropy(model(x_valid), y_valid)
            trainprof.log_loss(valid, mode="eval", step=step)
            logged[step] = time.time()
        time.sleep(STEP_SECONDS)
    return logged


def _firing_since(base: str, alert: str, affects: str | None = None) -> list[float]:
    """When each of the alert's firing instances became active (Unix seconds)."""
    alerts = get_json(f"{base}/api/v1/alerts")["data"]["alerts"]
    out = []
    for a in alerts:
        if a["labels"]["alertname"] != alert or a["state"] != "firing":
            continue
        if affects is not None and a["labels"].get("affects") != affects:
            continue
        stamp = a["activeAt"].replace("Z", "+00:00")
        out.append(_unix(stamp))
    return out


def _unix(rfc3339: str) -> float:
    import datetime

    head, _, rest = rfc3339.partition(".")
    fraction = "0." + rest.split("+")[0] if rest else "0"
    stamp = datetime.datetime.fromisoformat(head + "+00:00")
    return stamp.timestamp() + float(fraction)


def _history(base: str, start: float, end: float, alert: str) -> list[int]:
    """The alert's firing state (0 or 1) every 0.25 s from `start` to `end`."""
    expr = f'count(ALERTS{{alertname="{alert}", alertstate="firing"}}) or vector(0)'
    url = f"{base}/api/v1/query_range?query={_quote(expr)}&start={start}&end={end}&step=0.25"
    result = get_json(url)["data"]["result"]
    return [int(float(v)) for _, v in result[0]["values"]] if result else []


def _quote(text: str) -> str:
    import urllib.parse

    return urllib.parse.quote(text)


def test_one_configuration_fires_loss_not_decreasing_when_the_loss_stops_decreasing(
    prometheus_bin, tmp_path, monkeypatch
):
    config = tmp_path / "rules.yaml"
    config.write_text(CONFIG)
    monkeypatch.setenv("TRAINPROF_RULES_CONFIG", str(config))
    session = trainprof.start(port=0, addr="127.0.0.1", training_job="plateau", rank=0)
    files = {"rules.yaml": _rules(config)}
    name = alert_name("LossNotDecreasing")
    with prometheus(prometheus_bin, tmp_path, _prometheus_config(session.port), files) as base:
        wait_for_targets(base, 1)
        began = time.time()
        logged = _train(75)
        time.sleep(2.0)  # a few more evaluations of the final state
        ended = time.time()
        since = _firing_since(base, name)
        assert len(since) == 1, since  # one instance: the eval loss's
        # the first evaluation after the plateau is at step 60 (baseline: step 40)
        assert logged[60] - 0.1 <= since[0] <= logged[60] + 3.0, (since, logged[60])
        history = _history(base, began, ended, name)
        first = history.index(1)
        assert 0 not in history[first:], "it resolved and fired again"
        assert not _firing_since(base, INPUT_MISSING_ALERT, "LossNotDecreasing")
        got = get_json(
            f"{base}/api/v1/query?query=trainprof_training_loss_evaluated"
            '{mode="eval",num_steps="20"}'
        )["data"]["result"]
        assert got, "the process evaluates the configuration's num_steps"


def test_without_the_configuration_the_rule_says_its_input_is_missing(prometheus_bin, tmp_path):
    config = tmp_path / "rules.yaml"
    config.write_text(CONFIG)
    session = trainprof.start(port=0, addr="127.0.0.1", training_job="unconfigured", rank=0)
    for step in range(0, 40, 5):
        trainprof.log_loss(1.0 / (1 + step), mode="eval", step=step)
    files = {"rules.yaml": _rules(config)}
    with prometheus(prometheus_bin, tmp_path, _prometheus_config(session.port), files) as base:
        wait_for_targets(base, 1)
        wait_for(
            lambda: _firing_since(base, INPUT_MISSING_ALERT, "LossNotDecreasing"),
            timeout=30,
            what="TrainprofRuleInputMissing for LossNotDecreasing",
        )
        alerts = get_json(f"{base}/api/v1/alerts")["data"]["alerts"]
        missing = next(a for a in alerts if a["labels"]["alertname"] == INPUT_MISSING_ALERT)
        assert missing["labels"]["training_job"] == "unconfigured"
        assert 'num_steps="20"' not in str(
            get_json(f"{base}/api/v1/query?query=trainprof_training_loss_evaluated")
        )


WATCHED = """\
rules:
  - rule: LossNotDecreasing
    parameters: {num_steps: 30}
  - rule: Overtraining
    parameters: {delta: 0.2}
"""


def _watched_state():
    import trainprof.torch as tt

    model = torch.nn.Linear(2, 2)
    tt.watch(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return trainprof.current().health


def test_watch_reads_the_documented_variable(tmp_path, monkeypatch):
    config = tmp_path / "rules.yaml"
    config.write_text(WATCHED)
    monkeypatch.setenv("TRAINPROF_RULES_CONFIG", str(config))
    trainprof.start(serve=False, training_job="env", rank=0)
    health = _watched_state()
    assert 30 in health.loss_num_steps and health.loss_delta == 0.2


def test_watch_reads_the_configuration_start_was_given(tmp_path):
    config = tmp_path / "rules.yaml"
    config.write_text(WATCHED)
    trainprof.start(serve=False, training_job="arg", rank=0, rules_config=str(config))
    trainprof.log_loss(0.5, mode="eval")  # before watch(): start() configured the losses
    assert 30 in trainprof.current().health.loss_num_steps
    health = _watched_state()
    assert 30 in health.loss_num_steps and health.loss_delta == 0.2


def test_rules_compile_names_the_settings_the_training_process_needs(tmp_path):
    import subprocess
    import sys

    config = tmp_path / "rules.yaml"
    config.write_text(WATCHED)
    done = subprocess.run(
        [sys.executable, "-m", "trainprof", "rules", "compile", "-c", str(config), "-o", "-"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"TRAINPROF_RULES_CONFIG={config}" in done.stderr
    assert "rules[0].parameters.num_steps = 30" in done.stderr
    assert "rules[1].parameters.delta = 0.2" in done.stderr
    assert INPUT_MISSING_ALERT in done.stdout  # and the alert that says when it was not

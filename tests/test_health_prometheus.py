"""A real Prometheus scrapes a training rank watched by trainprof.torch.watch and evaluates the
compiled tensor rules: the diverged run's rules fire, the healthy run's stay quiet."""

from __future__ import annotations

import time

import pytest
import torch

import trainprof
import trainprof.torch as tt
from trainprof.generation.render import to_yaml
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config

from servers import get_json, prometheus, wait_for_firing, wait_for_targets

RULES = ["ExplodingTensor", "UnchangedTensor", "VanishingGradient", "DeadRelu"]


@pytest.fixture(autouse=True)
def fresh_session():
    trainprof.stop()
    yield
    trainprof.stop()


def _rules_file() -> str:
    config = load_config(
        {"rules": [{"rule": r, "parameters": {"scan_interval_us": 1_000_000}} for r in RULES]}
    )
    return to_yaml({"groups": compile_rules(config).groups})


def _train(job: str, lr: float) -> int:
    session = trainprof.start(port=0, addr="127.0.0.1", training_job=job, rank=0, local_rank=0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    watcher = tt.watch(model, opt, save_interval=2)
    x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
    for _ in range(9):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        trainprof.log_loss(loss)
        opt.zero_grad()
    watcher.publish()
    return session.port


def _firing(base: str) -> set[str]:
    alerts = get_json(f"{base}/api/v1/alerts")["data"]["alerts"]
    return {a["labels"]["rule"] for a in alerts if a["state"] == "firing"}


def _config(port: int) -> str:
    return f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: [health.rules.yaml]
scrape_configs:
  - job_name: train
    static_configs: [{{targets: ["127.0.0.1:{port}"]}}]
"""


def test_a_diverged_run_fires_in_a_real_prometheus(prometheus_bin, tmp_path):
    port = _train("diverged", lr=float("nan"))
    files = {"health.rules.yaml": _rules_file()}
    with prometheus(prometheus_bin, tmp_path, _config(port), files) as base:
        wait_for_targets(base, 1)
        # NaN activations are never > 0, so its ReLU layer counts as dead too
        assert {"ExplodingTensor", "DeadRelu"} <= wait_for_firing(
            base, {"ExplodingTensor", "DeadRelu"}, timeout=60
        )


def test_a_healthy_run_stays_quiet_in_a_real_prometheus(prometheus_bin, tmp_path):
    port = _train("healthy", lr=0.1)
    files = {"health.rules.yaml": _rules_file()}
    with prometheus(prometheus_bin, tmp_path, _config(port), files) as base:
        wait_for_targets(base, 1)
        # every rule evaluated several times on the scraped series, none firing
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            assert _firing(base) == set()
            time.sleep(0.5)
        rules = get_json(f"{base}/api/v1/rules")["data"]["groups"]
        evaluated = {
            r["labels"]["rule"] for g in rules for r in g["rules"] if r.get("health") == "ok"
        }
        assert set(RULES) <= evaluated

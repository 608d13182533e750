"""StalledTrainingRule live: a real Prometheus scrapes a training rank whose loop steps (a
watched tiny model, a save every step) and then stops stepping while the process lives on.
The rule (threshold 3 s) stays quiet while the loop steps and fires once it stops; the same
run written as an smdebug trial, on the run's own clock, replays to the same verdicts: quiet
up to the last step, firing at the last step once the trial ends after the stall."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import trainprof
import trainprof.torch as tt
from trainprof.generation.render import to_yaml
from trainprof.replay.tensors import replay_trial
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config

from servers import get_json, prometheus, query, wait_for_firing, wait_for_targets
from smdebug_writer import write_trial

THRESHOLD = 3.0
CONFIG = load_config(
    {
        "rules": [
            {
                "rule": "StalledTrainingRule",
                "parameters": {"threshold": THRESHOLD, "scan_interval_us": 1_000_000},
            }
        ]
    }
)


@pytest.fixture(autouse=True)
def fresh_session():
    trainprof.stop()
    yield
    trainprof.stop()


class Loop(threading.Thread):
    """A training loop stepping every 0.2 s until `stall` is set; then it hangs (alive)."""

    def __init__(self):
        super().__init__(daemon=True)
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
        )
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.watcher = tt.watch(self.model, self.opt, save_interval=1)
        self.stall = threading.Event()
        self.trial: dict[int, dict] = {}
        self.wall_times: dict[int, float] = {}

    def run(self):
        x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
        step = 0
        while not self.stall.is_set():
            weight = self.model[0].weight.detach().clone().numpy()
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
            self.watcher.publish()
            self.trial[step] = {"0.weight": weight, "loss": np.float32(loss.item())}
            self.wall_times[step] = time.time()
            step += 1
            time.sleep(0.2)


def _config(port: int) -> str:
    return f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: [health.rules.yaml]
scrape_configs:
  - job_name: train
    static_configs: [{{targets: ["127.0.0.1:{port}"]}}]
"""


def _stalled_state(base: str) -> set[str]:
    alerts = get_json(f"{base}/api/v1/alerts")["data"]["alerts"]
    return {a["state"] for a in alerts if a["labels"].get("rule") == "StalledTrainingRule"}


def test_a_loop_that_stops_stepping_fires_and_replays_alike(prometheus_bin, promtool, tmp_path):
    session = trainprof.start(port=0, addr="127.0.0.1", training_job="stall", rank=0, local_rank=0)
    loop = Loop()
    loop.start()
    files = {"health.rules.yaml": to_yaml({"groups": compile_rules(CONFIG).groups})}
    try:
        with prometheus(prometheus_bin, tmp_path, _config(session.port), files) as base:
            wait_for_targets(base, 1)
            # stepping: the rule has its series and stays quiet, evaluation after evaluation
            deadline = time.monotonic() + 3 * THRESHOLD
            while time.monotonic() < deadline:
                series = query(base, "trainprof_tensor_last_save_timestamp_seconds")
                assert series["data"]["result"]
                assert _stalled_state(base) == set()
                time.sleep(0.5)
            loop.stall.set()
            loop.join()
            stopped = time.time()
            wait_for_firing(base, {"StalledTrainingRule"}, timeout=30)
            fired = time.time()
    finally:
        loop.stall.set()
        loop.join()
    loop.watcher.close()
    last = max(loop.trial)
    assert fired - loop.wall_times[last] >= THRESHOLD

    def replay(name: str, end: float):
        root = write_trial(tmp_path / name, loop.trial, wall_times=loop.wall_times)
        (root / "training_job_end.ts").write_text(f"{end}")
        return replay_trial(str(root), CONFIG).rules["StalledTrainingRule"]

    # replay scrapes the trial's clock every second here and reads a save one scrape late
    # at most: its alert may come up to two scrapes after the live one
    late = 2.0
    assert not replay("until-the-stall", stopped).fired
    verdict = replay("after-the-stall", fired + late)
    assert verdict.first_fired_step == last
    assert loop.wall_times[last] + THRESHOLD <= verdict.first_fired_at <= fired + late

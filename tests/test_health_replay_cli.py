"""`trainprof replay DIR` of a SageMaker Debugger tensor trial, as a former user runs it."""

from __future__ import annotations

import json

import numpy as np
import pytest

import warm_cli
from smdebug_writer import write_trial

LOSS = "CrossEntropyLoss_output_0"


def run(*args) -> warm_cli.Run:
    """`python -m trainprof.cli ARGS` in a process of its own (forked with torch imported)."""
    return warm_cli.run(*args, timeout=120)


def _trial(tmp_path):
    losses = [0.30, 0.33, 0.31, 0.30, 0.28]
    steps = {i * 4: {LOSS: np.float32(v)} for i, v in enumerate(losses)}
    return write_trial(tmp_path / "job-a" / "debug-output", steps)


def test_replay_json_has_first_fired_step(promtool, tmp_path):
    root = _trial(tmp_path)
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "rules:\n  - rule: LossNotDecreasing\n    parameters: {diff_percent: '0'}\n"
        "  - rule: VanishingGradient\n"
    )
    done = run("replay", str(root.parent), "--rules", str(rules), "--json", "-")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)["rules"]
    loss = out["LossNotDecreasing"]
    assert loss["fired"] is True and loss["first_fired_step"] == 12
    assert loss["alerts"][0]["labels"]["training_job"] == "job-a"
    assert loss["first_fired_at"] == pytest.approx(1.7e9 + 12)  # the step's wall time
    assert loss["status"] == "fired" and loss["datapoints"] == 2  # evaluated at 12 and 16
    # one alert for the job; the loss it found (rank and mode) beside it: from step 12 (0.30
    # did not fall from step 0's 0.30), and at step 16, where that evaluation still stands
    # (the process evaluates every num_steps, 10)
    (unit,) = loss["affected"]
    assert (unit["first_step"], unit["last_step"], unit["worst"]) == (12, 16, 0.3)
    assert unit["labels"]["mode"] and "training_job" not in unit["labels"]
    vanishing = out["VanishingGradient"]
    assert "trainprof_tensor_mean_abs" in vanishing.pop("reason")  # what it would have read
    assert vanishing == {
        "fired": False,
        "status": "no_data",
        "datapoints": 0,
        "first_fired_at": None,
        "first_fired_step": None,
        "alerts": [],
        "affected": [],
    }


def test_replay_without_rules_evaluates_the_tensor_rules_and_prints_a_table(promtool, tmp_path):
    root = _trial(tmp_path)
    done = run("replay", str(root))
    assert done.returncode == 0, done.stderr
    assert "LossNotDecreasing" in done.stdout and "UnchangedTensor" in done.stdout
    assert "5 saved steps (0 to 16)" in done.stdout


def test_damaged_event_files_are_skipped_and_named(promtool, tmp_path):
    root = _trial(tmp_path)
    bad = root / "events" / "000000000008" / "000000000008_worker_0.tfevents"
    bad.write_bytes(bad.read_bytes()[:-3])
    done = run("replay", str(root), "--json", "-")
    assert done.returncode == 0
    assert "000000000008_worker_0.tfevents" in done.stderr and "truncated" in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_rule_configuration_exits_2_with_its_path(tmp_path):
    root = _trial(tmp_path)
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - rule: TensorVariance\n")
    done = run("replay", str(root), "--rules", str(rules), "--json", "-")
    assert done.returncode == 2
    assert "max_threshold" in done.stderr and "TensorVariance" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_folder_without_events_is_not_a_trial(tmp_path):
    (tmp_path / "events").mkdir()
    done = run("replay", str(tmp_path))
    assert done.returncode == 2
    assert "no .tfevents files" in done.stderr and "Traceback" not in done.stderr


def test_a_damaged_trees_collection_is_named_and_the_rest_replayed(promtool, tmp_path):
    from smdebug_writer import xgboost_trees

    xgboost = pytest.importorskip("xgboost")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    booster = xgboost.train(
        {"max_depth": 2, "nthread": 1},
        xgboost.DMatrix(x, label=(x[:, 0] > 0).astype(float)),
        num_boost_round=2,
    )
    steps = {i: xgboost_trees(booster, i) for i in range(2)}
    steps[0]["trees/Yes"] = steps[0]["trees/Yes"][:-1]
    root = write_trial(tmp_path / "xgb", steps, regexes={"trees": ["^trees/.*"]})
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - rule: TreeDepth\n")
    done = run("replay", str(root), "--rules", str(rules), "--json", "-")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "trees collection is damaged (columns of different lengths: Yes " in done.stderr
    assert "events/000000000000" in done.stderr and "events/000000000001" not in done.stderr
    assert json.loads(done.stdout)["rules"]["TreeDepth"]["first_fired_step"] == 1

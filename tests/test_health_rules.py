"""The tensor rules reproduce SageMaker's historical test facts, replayed from smdebug trials
through the real promtool rule engine (RULE-SEMANTICS.md section 4.1)."""

from __future__ import annotations

import numpy as np

from trainprof.replay.tensors import replay_trial
from trainprof.rules.config import load_config

from smdebug_writer import write_trial


def run(tmp_path, steps, rule, params=None, collections=None, **kwargs):
    root = write_trial(tmp_path / "trial", steps, collections=collections, **kwargs)
    entry = {"rule": rule, **({"parameters": params} if params else {})}
    config = load_config({"rules": [entry]})
    return replay_trial(str(root), config).rules[rule]


LOSS = "CrossEntropyLoss_output_0"


def losses(values, every=4):
    return {i * every: {LOSS: np.float32(v)} for i, v in enumerate(values)}


def test_loss_not_decreasing_fires_first_at_step_12_and_not_again_until_16(promtool, tmp_path):
    verdict = run(
        tmp_path, losses([0.30, 0.33, 0.31, 0.30, 0.28]), "LossNotDecreasing", {"diff_percent": 0}
    )
    assert verdict.first_fired_step == 12
    assert [a.step for a in verdict.alerts] == [12]  # still the step-12 evaluation at 16


def test_loss_not_decreasing_documented_reading_of_diff_percent(promtool, tmp_path):
    # The 2019 reading fired first at 24; trainprof's (documented) reading fires at 12:
    # 0.30 did not fall by 20 % from 0.30.
    verdict = run(
        tmp_path,
        losses([0.30, 0.33, 0.31, 0.30, 0.28, 0.20, 0.42]),
        "LossNotDecreasing",
        {"diff_percent": "20"},
    )
    assert verdict.first_fired_step == 12


def test_loss_that_keeps_falling_never_fires(promtool, tmp_path):
    verdict = run(tmp_path, losses([0.9, 0.8, 0.7, 0.6, 0.5, 0.4]), "LossNotDecreasing")
    assert not verdict.fired


def test_unchanged_tensor_fires_at_step_2_not_before(promtool, tmp_path):
    ones = np.ones((3, 3), dtype=np.float32)
    steps = {0: {"fc.weight": ones}, 1: {"fc.weight": ones}, 2: {"fc.weight": ones}}
    verdict = run(tmp_path, steps, "UnchangedTensor", collections={"weights": ["fc.weight"]})
    assert verdict.first_fired_step == 2


def test_unchanged_tensor_saved_once_never_fires(promtool, tmp_path):
    steps = {5: {"fc.weight": np.ones(4, dtype=np.float32)}}
    assert not run(tmp_path, steps, "UnchangedTensor").fired


def test_changing_tensor_does_not_fire(promtool, tmp_path):
    steps = {s: {"fc.weight": np.full(4, float(s), dtype=np.float32)} for s in range(4)}
    assert not run(tmp_path, steps, "UnchangedTensor").fired


def _classes(labels, predictions):
    return {0: {"labels": np.array(labels), "predictions": np.array(predictions)}}


def test_confusion_perfect_predictions_of_ten_classes_do_not_fire(promtool, tmp_path):
    y = np.arange(10)
    assert not run(tmp_path, _classes(y, y), "Confusion").fired


def test_confusion_one_error_among_ten_fires(promtool, tmp_path):
    y = np.arange(10)
    p = y.copy()
    p[9] = 0
    assert run(tmp_path / "a", _classes(y, p), "Confusion").first_fired_step == 0
    strict = run(tmp_path / "b", _classes(y, p), "Confusion", {"min_diag": 0, "max_off_diag": 0.01})
    assert strict.fired


def test_class_imbalance_990_to_10_fires(promtool, tmp_path):
    y = np.array([0] * 990 + [1] * 10)
    steps = {3: {"labels": y, "predictions": y}}
    assert run(tmp_path, steps, "ClassImbalance").first_fired_step == 3


def test_balanced_classes_do_not_fire(promtool, tmp_path):
    y = np.array([0, 1] * 300)
    assert not run(tmp_path, {3: {"labels": y, "predictions": y}}, "ClassImbalance").fired


def test_stalled_training_fires_on_the_trials_own_clock(promtool, tmp_path):
    # saves every 4 s (steps 0-16), then nothing until step 20, 40 minutes later
    steps = {s: {"fc.weight": np.full(2, float(s), dtype=np.float32)} for s in (0, 4, 8, 12, 16)}
    root = write_trial(tmp_path / "t", {**steps, 20: {"fc.weight": np.ones(2, np.float32)}})
    # the writer stamps step s at 1.7e9 + s: move step 20's event 40 minutes later
    from smdebug_writer import event, record

    late = root / "events" / f"{20:012d}" / f"{20:012d}_worker_0.tfevents"
    late.write_bytes(record(event("fc.weight", np.ones(2, np.float32), 20, wall_time=1.7e9 + 2400)))
    config = load_config({"rules": [{"rule": "StalledTrainingRule"}, {"rule": "AllZero"}]})
    result = replay_trial(str(root), config)
    verdict = result.rules["StalledTrainingRule"]
    assert verdict.first_fired_step == 16  # the last save before the stall
    assert 1.7e9 + 16 + 1800 <= verdict.first_fired_at <= 1.7e9 + 16 + 1800 + 30
    quick = run(tmp_path / "q", steps, "StalledTrainingRule")
    assert not quick.fired


def test_similar_across_runs_compares_two_trials_at_the_same_step(promtool, tmp_path):
    def trial(name, third):
        steps = {
            0: {"fc.weight": np.ones(3, np.float32)},
            2: {"fc.weight": np.full(3, 2.0, np.float32)},
            4: {"fc.weight": np.full(3, third, np.float32)},
        }
        return write_trial(tmp_path / name, steps, collections={"weights": ["fc.weight"]})

    a, same, other = trial("a", 3.0), trial("same", 3.0), trial("other", 3.5)
    params = {"other_trials": str(same)}
    config = load_config({"rules": [{"rule": "SimilarAcrossRuns", "parameters": params}]})
    assert not replay_trial(str(a), config).rules["SimilarAcrossRuns"].fired
    params = {"other_trials": str(other)}
    config = load_config({"rules": [{"rule": "SimilarAcrossRuns", "parameters": params}]})
    verdict = replay_trial(str(a), config).rules["SimilarAcrossRuns"]
    assert verdict.first_fired_step == 4
    assert verdict.alerts[0].labels["training_job"] == "a"

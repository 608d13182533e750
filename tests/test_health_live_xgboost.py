"""Real XGBoost boosters trained on the CPU with the trainprof callback, into the XGBoost rules'
condition (a label leaked by one feature: the importance piles on it and the trees stop
after one split) and into health (a label spread over all features, trees as deep as
max_depth). The live series go through the compiled rules in promtool after every round;
the same run written as an smdebug trial (SageMaker's XGBoost hook saved
`feature_importance/weight/<feature>`) replays to the same FeatureImportanceOverweight
verdict. TreeDepth is live only: replay reads no `trees` collection."""

from __future__ import annotations

import time

import numpy as np
import pytest

import trainprof
from trainprof.replay.tensors import Save, evaluate_saves, replay_trial
from trainprof.rules.config import load_config

from smdebug_writer import write_trial

xgboost = pytest.importorskip("xgboost")

pytestmark = pytest.mark.tools

CONFIG = load_config({"rules": [{"rule": "FeatureImportanceOverweight"}, {"rule": "TreeDepth"}]})
ROUNDS = 8


@pytest.fixture(autouse=True)
def fresh_session():
    trainprof.stop()
    yield
    trainprof.stop()


class Recorder(xgboost.callback.TrainingCallback):
    """After trainprof's callback: the session's families (live) and the importance shares
    smdebug's hook would have saved (the trial), each round."""

    def __init__(self):
        super().__init__()
        self.saves: list[Save] = []
        self.trial: dict[int, dict] = {}

    def after_iteration(self, model, epoch, evals_log):
        scores = model.get_score(importance_type="weight")
        total = sum(scores.values())
        self.trial[epoch] = {
            f"feature_importance/weight/{name}": np.float64(value / total)
            for name, value in scores.items()
        }
        self.saves.append(Save(epoch, time.time(), list(trainprof.current().families())))
        return False


def boost(condition, tmp_path):
    from trainprof.integrations.xgboost import TrainprofCallback

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 10))
    if condition == "leaked_label":
        y = (x[:, 0] > 0).astype(float)  # one feature decides the label alone
    else:
        y = (x.sum(axis=1) + rng.normal(scale=0.5, size=600) > 0).astype(float)
    recorder = Recorder()
    xgboost.train(
        {"max_depth": 4, "objective": "binary:logistic", "eta": 0.3, "nthread": 1},
        xgboost.DMatrix(x, label=y),
        num_boost_round=ROUNDS,
        callbacks=[
            TrainprofCallback(save_interval=1, serve=False, training_job=condition),
            recorder,
        ],
    )
    live = {n for n, v in evaluate_saves(recorder.saves, CONFIG).rules.items() if v.fired}
    trial = write_trial(tmp_path / condition, recorder.trial)
    replayed = replay_trial(str(trial), CONFIG)
    assert ("FeatureImportanceOverweight" in live) == replayed.rules[
        "FeatureImportanceOverweight"
    ].fired
    assert not replayed.rules["TreeDepth"].fired  # nothing in the trial to judge it on
    return live


def test_a_leaked_label_fires_both_xgboost_rules(promtool, tmp_path):
    assert boost("leaked_label", tmp_path) == {"FeatureImportanceOverweight", "TreeDepth"}


def test_a_label_spread_over_the_features_is_quiet(promtool, tmp_path):
    assert boost("healthy", tmp_path) == set()

"""Real XGBoost boosters trained on the CPU with the trainprof callback, into the XGBoost rules'
condition (a label leaked by one feature: the importance piles on it and the trees stop
after one split) and into health (a label spread over all features, trees as deep as
max_depth). The live series go through the compiled rules in promtool after every round;
the same run written as an smdebug trial (SageMaker's XGBoost hook saved
`feature_importance/weight/<feature>` and its `trees` collection, the `trees/<column>`
rows of each round's tree) replays to the same FeatureImportanceOverweight and TreeDepth
verdicts, with the same tree depth at every saved round."""

from __future__ import annotations

import time

import numpy as np
import pytest

import trainprof
from trainprof.replay.smdebug import fold, read_trial
from trainprof.replay.tensors import Save, evaluate_saves, replay_trial
from trainprof.rules.config import load_config

from smdebug_writer import write_trial, xgboost_trees

xgboost = pytest.importorskip("xgboost")


CONFIG = load_config({"rules": [{"rule": "FeatureImportanceOverweight"}, {"rule": "TreeDepth"}]})
ROUNDS = 8


@pytest.fixture(autouse=True)
def fresh_session():
    trainprof.stop()
    yield
    trainprof.stop()


class Recorder(xgboost.callback.TrainingCallback):
    """After trainprof's callback: the session's families and tree depth (live), and the
    importance shares and trees smdebug's hook would have saved (the trial), each round."""

    def __init__(self):
        super().__init__()
        self.saves: list[Save] = []
        self.depths: list[float] = []
        self.trial: dict[int, dict] = {}

    def after_iteration(self, model, epoch, evals_log):
        scores = model.get_score(importance_type="weight")
        total = sum(scores.values())
        self.trial[epoch] = {
            f"feature_importance/weight/{name}": np.float64(value / total)
            for name, value in scores.items()
        } | xgboost_trees(model, epoch)
        self.saves.append(Save(epoch, time.time(), list(trainprof.current().families())))
        self.depths.append(trainprof.current().value("trainprof_xgboost_tree_depth"))
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
    trial = write_trial(tmp_path / condition, recorder.trial, regexes={"trees": ["^trees/.*"]})
    assert [s.state.tree_depth for s in fold(read_trial(trial))] == recorder.depths
    replayed = replay_trial(str(trial), CONFIG)
    for rule in ("FeatureImportanceOverweight", "TreeDepth"):
        assert (rule in live) == replayed.rules[rule].fired, rule
    assert not [n for n in replayed.notes if "trees" in n]
    return live


def test_a_leaked_label_fires_both_xgboost_rules(promtool, tmp_path):
    assert boost("leaked_label", tmp_path) == {"FeatureImportanceOverweight", "TreeDepth"}


def test_a_label_spread_over_the_features_is_quiet(promtool, tmp_path):
    assert boost("healthy", tmp_path) == set()

"""The XGBoost callback publishes importance shares, tree depth and losses while boosting."""

from __future__ import annotations

import numpy as np
import pytest

import trainprof

xgboost = pytest.importorskip("xgboost")


@pytest.fixture(autouse=True)
def fresh_session():
    trainprof.stop()
    yield
    trainprof.stop()


def test_one_dominant_feature_and_the_depth_of_the_trees():
    from trainprof.integrations.xgboost import TrainprofCallback

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 5))
    y = (x[:, 0] > 0).astype(float)  # only feature 0 matters
    dtrain = xgboost.DMatrix(x[:300], label=y[:300])
    dvalid = xgboost.DMatrix(x[300:], label=y[300:])
    xgboost.train(
        {"max_depth": 3, "objective": "binary:logistic", "eta": 0.3},
        dtrain,
        num_boost_round=6,
        evals=[(dtrain, "train"), (dvalid, "validation")],
        verbose_eval=False,
        callbacks=[TrainprofCallback(save_interval=5, serve=False)],
    )
    session = trainprof.current()
    top1 = session.value("trainprof_xgboost_feature_importance_top_ratio", top="1")
    top3 = session.value("trainprof_xgboost_feature_importance_top_ratio", top="3")
    assert 0.3 < top1 <= top3 <= 1
    assert 1 <= session.value("trainprof_xgboost_tree_depth") <= 3
    assert session.value("trainprof_training_loss_step", mode="train") == 5
    assert session.value("trainprof_training_loss_step", mode="eval") == 5
    assert session.value("trainprof_instrumentation_errors_total") == 0

"""XGBoost: feature importance, tree depth and losses for the XGBoost rules, with a callback.

    import xgboost
    from trainprof.integrations.xgboost import TrainprofCallback

    booster = xgboost.train(params, dtrain, evals=[(dtrain, "train"), (dvalid, "validation")],
                            callbacks=[TrainprofCallback(save_interval=10)])

Every `save_interval` boosting rounds (rounds 0, save_interval, ...) the callback publishes:

- the share of the total importance held by the top 1..10 features
  (`trainprof_xgboost_feature_importance_top_ratio{top}`, importance type "weight" as
  SageMaker's `feature_importance/weight` by default) for FeatureImportanceOverweight;
- the depth of the deepest tree so far (`trainprof_xgboost_tree_depth`, root at 0) for
  TreeDepth, measured on the trees' JSON dump by `trainprof.training.health.trees.tree_depth`
  (replay measures a trial's `trees` collection with the same function);
- the last value of the first evaluation metric of each evaluation set as a loss (the set
  named "train" in mode train, the others in mode eval) at the round number, for
  LossNotDecreasing, Overfit and Overtraining.
"""

from __future__ import annotations

import json
from typing import Any

from trainprof import extras

try:
    import xgboost
except ModuleNotFoundError as e:
    raise extras.reraise(e, "trainprof.integrations.xgboost") from None

from trainprof.integrations._callbacks import ensure_started
from trainprof.training import session as api
from trainprof.training.health.trees import tree_depth


class TrainprofCallback(xgboost.callback.TrainingCallback):
    def __init__(
        self, save_interval: int = 1, importance_type: str = "weight", **start_kwargs: Any
    ):
        super().__init__()
        if int(save_interval) < 1:
            raise ValueError(f"save_interval must be a positive integer, got {save_interval!r}")
        self.save_interval = int(save_interval)
        self.importance_type = importance_type
        self._start_kwargs = start_kwargs
        self._depth = 0
        self._trees_seen = 0

    def before_training(self, model: Any) -> Any:
        try:
            ensure_started("xgboost", xgboost.__version__, dict(self._start_kwargs))
        except Exception:
            api.current()._error()
        return model

    def after_iteration(self, model: Any, epoch: int, evals_log: Any) -> bool:
        if epoch % self.save_interval:
            return False
        session = api.current()
        try:
            scores = model.get_score(importance_type=self.importance_type)
            dumps = model.get_dump(dump_format="json")
            for tree in dumps[self._trees_seen :]:
                self._depth = max(self._depth, tree_depth(json.loads(tree)))
            self._trees_seen = len(dumps)
            with session._lock:
                session.health.observe_feature_importance(scores.values())
                session.health.observe_tree_depth(self._depth)
            for name, metrics in (evals_log or {}).items():
                if metrics:
                    history = next(iter(metrics.values()))
                    if history:
                        mode = "train" if name == "train" else "eval"
                        api.log_loss(float(_last(history)), mode, step=epoch)
        except Exception:
            session._error()
        return False  # never stop training


def _last(history: Any) -> float:
    value = history[-1]
    return value[0] if isinstance(value, tuple) else value

"""Keras 3: time every training, test and predict batch with a callback.

    import keras
    from trainprof.integrations.keras import TrainprofCallback

    model.fit(x, y, batch_size=32, callbacks=[TrainprofCallback(batch_size=32)])

Keras compiles a whole training step into one function, so there are no forward / backward
phases to see. What is measured, per rank:

- train steps from `on_train_batch_begin` to `on_train_batch_end` (with `steps_per_execution`
  above 1, one Keras "batch" call covers that many batches and is one step here); samples
  per step if you give `batch_size`;
- dataloader: from the end of one training batch to the start of the next, which in Keras's
  loop is fetching the next batch plus the `on_train_batch_end` of callbacks listed after
  this one (put it last); gaps that span an epoch end or a validation run are not counted;
- losses (`trainprof.log_loss`): the training loss Keras reports after each batch (its
  running mean over the epoch) at the batch's step, and `val_loss` at each epoch end as the
  eval loss at the epoch's last step;
- test (validation) batches as eval steps, predict batches as predict steps.

Works with any Keras 3 backend; trainprof's tests run it on the torch backend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainprof import extras

try:
    import keras
except ModuleNotFoundError as e:
    raise extras.reraise(e, "trainprof.integrations.keras") from None

from trainprof.integrations._callbacks import HookTimeline, ensure_started, guarded
from trainprof.training import session as api


def _eval_batch_hooks(mode: str) -> tuple[Callable[..., None], Callable[..., None]]:
    """The batch begin and end hooks of a loop that does not train (test, predict): each
    batch an eval step of `mode`."""

    def batch_begin(self: Any, batch: int, logs: Any = None) -> None:
        self._eval.begin_step(mode)

    def batch_end(self: Any, batch: int, logs: Any = None) -> None:
        self._eval.end_step()

    return guarded(batch_begin), guarded(batch_end)


class TrainprofCallback(keras.callbacks.Callback):
    """Times Keras's fit, evaluate and predict loops (see the module doc).

    `start_kwargs` go to `trainprof.start()` if the script has not started trainprof.
    """

    def __init__(self, batch_size: int | None = None, **start_kwargs: Any):
        super().__init__()
        self._batch_size = batch_size
        self._start_kwargs = start_kwargs
        self._timeline = HookTimeline()
        self._eval = HookTimeline()
        self._train_batches = 0

    def _start(self) -> None:
        ensure_started("keras", keras.__version__, dict(self._start_kwargs))

    @guarded
    def on_train_begin(self, logs: Any = None) -> None:
        self._start()

    @guarded
    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self._timeline.end_gap()
        self._timeline.begin_step("train", samples=self._batch_size)

    @guarded
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._timeline.end_step()
        loss = (logs or {}).get("loss")
        if loss is not None:
            api.log_loss(loss, "train", step=self._train_batches)
        self._train_batches += 1
        self._timeline.begin_gap()

    @guarded
    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self._timeline.cancel_gap()
        loss = (logs or {}).get("val_loss")
        if loss is not None:
            api.log_loss(loss, "eval", step=max(self._train_batches - 1, 0))

    @guarded
    def on_train_end(self, logs: Any = None) -> None:
        self._timeline.close()

    @guarded
    def on_test_begin(self, logs: Any = None) -> None:
        self._start()
        self._timeline.cancel_gap()

    @guarded
    def on_predict_begin(self, logs: Any = None) -> None:
        self._start()

    on_test_batch_begin, on_test_batch_end = _eval_batch_hooks("eval")
    on_predict_batch_begin, on_predict_batch_end = _eval_batch_hooks("predict")

    @guarded
    def on_test_end(self, logs: Any = None) -> None:
        self._eval.close()

    on_predict_end = on_test_end

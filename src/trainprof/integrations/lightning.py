"""PyTorch Lightning: time every step and its phases with a callback.

    import lightning.pytorch as pl
    from trainprof.integrations.lightning import TrainprofCallback

    trainer = pl.Trainer(callbacks=[TrainprofCallback()])   # starts trainprof if not started
    trainer.fit(model, datamodule)

What is measured, per rank:

- train steps, from `on_train_batch_start` to `on_train_batch_end`, with the batch size of
  the first tensor in the batch as samples;
- phases: forward (batch start to `on_before_backward`: `training_step` and the loss),
  backward (to `on_after_backward`), optimizer (`on_before_optimizer_step` to the batch end:
  gradient clipping and the optimizer update); the rest of the step counts as "other";
- dataloader: the time Lightning spends fetching each training batch. Lightning has no
  public hook around the fetch; the callback wraps the training data fetcher's profiling
  hooks (a Lightning internal, checked on every batch). Where they are missing the
  dataloader phase stays at zero and nothing else changes;
- losses (`trainprof.log_loss`): each training batch's loss (the tensor `training_step`
  returned, or its "loss" entry; read on the host only on a watcher's saving steps), and
  the mean validation loss of each validation run (what `validation_step` returned), as the
  eval loss at the trainer's global step;
- validation and test batches as eval steps, predict batches as predict steps (all
  counted under the "evaluation" phase); the sanity check before training is not counted.

Uses `lightning.pytorch` if installed, else the older `pytorch_lightning` package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainprof import extras
from trainprof.integrations._callbacks import HookTimeline, batch_size, ensure_started, guarded
from trainprof.training import session as api

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package of Lightning < 2
    try:
        import pytorch_lightning as pl  # type: ignore[no-redef]
    except ModuleNotFoundError:
        raise extras.missing("lightning", "trainprof.integrations.lightning") from None


def _eval_batch_hooks(
    mode: str, then: Callable[[Any, Any, Any], None] | None = None
) -> tuple[Callable[..., None], Callable[..., None]]:
    """The batch start and end hooks of a loop that does not train: each batch an eval step
    of `mode` (none in the sanity check); `then(callback, trainer, outputs)` after each end."""

    def batch_start(
        self: Any, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not getattr(trainer, "sanity_checking", False):
            self._eval.begin_step(mode)

    def batch_end(
        self: Any,
        trainer: Any,
        pl_module: Any,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval.end_step()
        if then is not None:
            then(self, trainer, outputs)

    return guarded(batch_start), guarded(batch_end)


class TrainprofCallback(pl.Callback):
    """Times Lightning's training, validation, test and predict loops (see the module doc).

    `start_kwargs` go to `trainprof.start()` if the script has not started trainprof.
    """

    def __init__(self, **start_kwargs: Any):
        super().__init__()
        self._start_kwargs = start_kwargs
        self._timeline = HookTimeline()
        self._eval = HookTimeline()
        self._val_losses: list[Any] = []

    @guarded
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        ensure_started("lightning", pl.__version__, dict(self._start_kwargs))

    # --- training -------------------------------------------------------------------------

    @guarded
    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self._time_fetches(trainer)
        self._timeline.begin_step("train", samples=batch_size(batch))
        self._timeline.switch_phase("forward")

    @guarded
    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self._timeline.step is not None:
            self._timeline.switch_phase("backward")

    @guarded
    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self._timeline.end_phase()

    @guarded
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self._timeline.step is not None:
            self._timeline.switch_phase("optimizer")

    @guarded
    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._timeline.end_step()
        loss = _loss_of(outputs)
        if loss is not None:
            api.log_loss(loss, "train")

    @guarded
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._timeline.close()

    @guarded
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._timeline.close()
        self._eval.close()

    def _time_fetches(self, trainer: Any) -> None:
        # Lightning re-installs the fetcher's profiling hooks at every epoch start.
        fetcher = getattr(getattr(trainer, "fit_loop", None), "_data_fetcher", None)
        before = getattr(fetcher, "_start_profiler", None)
        after = getattr(fetcher, "_stop_profiler", None)
        if fetcher is None or before is None or after is None:
            return
        if getattr(before, "_trainprof", False):
            return
        open_fetch: list[Any] = []

        def start_fetch() -> None:
            before()
            try:
                frame = api.phase("dataloader")
                frame.__enter__()
                open_fetch.append(frame)
            except Exception:
                api.current()._error()

        def stop_fetch() -> None:
            try:
                while open_fetch:
                    open_fetch.pop().__exit__(None, None, None)
            except Exception:
                api.current()._error()
            after()

        start_fetch._trainprof = True  # type: ignore[attr-defined]
        fetcher._start_profiler = start_fetch
        fetcher._stop_profiler = stop_fetch

    # --- validation, test, predict ---------------------------------------------------------

    def _keep_val_loss(self, trainer: Any, outputs: Any) -> None:
        loss = _loss_of(outputs)
        if loss is not None and not getattr(trainer, "sanity_checking", False):
            self._val_losses.append(loss.detach() if hasattr(loss, "detach") else loss)

    @guarded
    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        losses, self._val_losses = self._val_losses, []
        if losses:
            mean = sum(float(v) for v in losses) / len(losses)
            api.log_loss(mean, "eval", step=int(trainer.global_step))

    on_validation_batch_start, on_validation_batch_end = _eval_batch_hooks("eval", _keep_val_loss)
    on_test_batch_start, on_test_batch_end = _eval_batch_hooks("eval")
    on_predict_batch_start, on_predict_batch_end = _eval_batch_hooks("predict")


def _loss_of(outputs: Any) -> Any:
    """The loss in a step's outputs: the tensor itself, or its "loss" entry."""
    if isinstance(outputs, dict):
        outputs = outputs.get("loss", outputs.get("val_loss"))
    if outputs is None or getattr(outputs, "numel", lambda: 1)() != 1:
        return None
    return outputs

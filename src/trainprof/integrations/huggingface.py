"""Hugging Face `transformers.Trainer`: time every optimizer step and its phases.

    from transformers import Trainer
    from trainprof.integrations.huggingface import TrainprofCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[TrainprofCallback()])   # starts trainprof if not started
    trainer.train()

What is measured, per rank:

- train steps: one per optimizer step (`on_step_begin` to `on_step_end`), so with gradient
  accumulation a step spans all its micro-batches, as the Trainer's `global_step` does;
  samples are the leading dimension of each training forward pass's first tensor input,
  tokens the elements of `input_ids` (padding included: counting real tokens would need a
  GPU sync);
- phases: forward (the model's forward passes, from module hooks), backward (from the end of
  a forward pass to the next forward pass or the optimizer: the backward pass, loss
  bookkeeping and gradient clipping), optimizer (`on_pre_optimizer_step` to
  `on_optimizer_step`); the rest of the step counts as "other";
- dataloader: the time between two optimizer steps (the Trainer fetches the next batches
  there), except where the Trainer logged, evaluated or saved in between: those gaps are not
  counted at all, since the Trainer has no hook around the fetch itself;
- losses (`trainprof.log_loss`): the training loss and `eval_loss` the Trainer logs (every
  `logging_steps`, and at each evaluation), at the Trainer's global step;
- evaluation and prediction batches as eval steps: from the model's forward pass to
  `on_prediction_step`. The forward hooks stay on the model for the Trainer's lifetime; a
  forward pass outside the Trainer's loops (your own inference) never reaches
  `on_prediction_step` and is not counted.
"""

from __future__ import annotations

from typing import Any

from trainprof import extras

try:
    import transformers
except ModuleNotFoundError as e:
    raise extras.reraise(e, "trainprof.integrations.huggingface") from None

from trainprof.integrations._callbacks import HookTimeline, batch_size, ensure_started, guarded
from trainprof.training import session as api


class TrainprofCallback(transformers.TrainerCallback):
    """Times the Trainer's training and evaluation (see the module doc).

    `start_kwargs` go to `trainprof.start()` if the script has not started trainprof.
    """

    def __init__(self, **start_kwargs: Any):
        self._start_kwargs = start_kwargs
        self._timeline = HookTimeline()
        self._eval = HookTimeline()
        self._hooks: list[Any] = []
        self._hooked: Any = None
        self._training_step = False

    @guarded
    def on_init_end(
        self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any
    ) -> None:
        ensure_started("transformers", transformers.__version__, dict(self._start_kwargs))
        self._hook(model)

    @guarded
    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any
    ) -> None:
        ensure_started("transformers", transformers.__version__, dict(self._start_kwargs))
        self._hook(model)

    def _hook(self, model: Any) -> None:
        if model is None or model is self._hooked:
            return
        self._remove_hooks()
        self._hooks = [
            model.register_forward_pre_hook(self._before_forward, with_kwargs=True),
            model.register_forward_hook(self._after_forward),
        ]
        self._hooked = model

    @guarded
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timeline.end_gap()
        self._timeline.begin_step("train")
        self._training_step = True

    @guarded
    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._training_step:
            self._timeline.switch_phase("optimizer")

    @guarded
    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timeline.end_phase()

    @guarded
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timeline.end_step()
        self._training_step = False
        self._timeline.begin_gap()

    @guarded
    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timeline.spoil_gap()
        logs = kwargs.get("logs") or {}
        for key, mode in (("loss", "train"), ("eval_loss", "eval")):
            if isinstance(logs.get(key), (int, float)):
                api.log_loss(logs[key], mode, step=int(state.global_step))

    @guarded
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timeline.spoil_gap()

    @guarded
    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timeline.spoil_gap()
        self._eval.cancel_step()

    @guarded
    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timeline.spoil_gap()
        self._eval.end_step()

    @guarded
    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timeline.cancel_gap()

    @guarded
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._timeline.close()
        self._training_step = False

    def _remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks, self._hooked = [], None

    @guarded
    def _before_forward(self, module: Any, args: Any, kwargs: Any) -> None:
        if self._training_step:
            self._timeline.switch_phase("forward")
            input_ids = kwargs.get("input_ids")
            api.add(
                samples=batch_size((args, kwargs)) or 0,
                tokens=input_ids.numel() if hasattr(input_ids, "numel") else 0,
            )
        elif not module.training:
            self._eval.cancel_step()  # a forward that never reached a prediction step
            self._eval.begin_step("eval")
        return None

    @guarded
    def _after_forward(self, module: Any, args: Any, output: Any) -> None:
        if self._training_step:
            self._timeline.switch_phase("backward")
        return None

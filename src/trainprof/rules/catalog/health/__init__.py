"""SageMaker Debugger's tensor rules: the model's health rather than the machine's.

They read the reductions the training process publishes (`trainprof.torch.watch`,
`trainprof.log_loss`, the framework and XGBoost callbacks; `trainprof.training.health.state`): per
collection the smallest and largest value of each reduction over its tensors
(`aggregate="min"` / `"max"`), and per tensor only for tensors watched with `include_regex`.
SageMaker evaluated these rules at every saved step; here they are evaluated every
`scan_interval_us` on the latest save, so a condition that holds at a save is seen until
the next save replaces it (replay of a trial evaluates after every saved step and reports
`first_fired_step`).

Parameters the training process must know to compute a reduction (LossNotDecreasing's
`num_steps`, UnchangedTensor's `rtol`/`atol`, DeadRelu's `threshold_inactivity`, ...) are
this rule's `inputs`: pass the same configuration to `trainprof.torch.watch(rules_config=)`.

One module per kind of trouble: `tensors` (the gradients and the watched tensors),
`progress` (the loss and the steps), `activations`, `predictions`, `inputs` and `xgboost`;
`common` holds what they share (the tensor selectors, the one alert, the one threshold
signal). `registry.TENSOR_RULES` lists them in report order.
"""

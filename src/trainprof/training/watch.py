"""`trainprof.torch.watch`: the reductions SageMaker Debugger's tensor rules need, live.

    import trainprof, trainprof.torch
    trainprof.start()
    watcher = trainprof.torch.watch(model, optimizer, save_interval=100)
    for x, y in loader:
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward()
        optimizer.step()                       # the step's tensors are reduced here
        trainprof.log_loss(loss)               # read on the host only on saving steps
        watcher.log_predictions(y, out)        # ClassImbalance, Confusion
        optimizer.zero_grad()

Every `save_interval` steps (steps 0, save_interval, ...) hooks reduce the watched tensors on
their device (`trainprof.training.health.reductions`): gradients when the optimizer is about to
step, weights and biases before and after it (the update ratio), ReLU outputs and tanh/sigmoid
inputs in the forward pass. The save's results are concatenated and copied to the host once, after
the optimizer step; a step that saves nothing only increments a counter.

Steps: with an optimizer, each `optimizer.step()` ends a step's tensors (what the loop logs
after it, up to the next training forward, still belongs to that step). Without one, each forward of
`model` in training mode begins a step (so gradient accumulation over several forwards counts
several steps), and gradients are reduced as they are accumulated.

Collections (smdebug's names): gradients, weights, biases, relu_output, relu_input,
tanh_input, sigmoid_input (activation inputs: variance, and saturation for tanh/sigmoid).
Per-collection aggregates are published for all; per-tensor series only for tensors whose
name (`weights/fc1.weight`, `gradients/fc1.weight`, `relu_output/net.1`) matches
`include_regex`, at most `metrics.MAX_TENSOR_SERIES`.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Concatenate, ParamSpec

from trainprof import extras

try:
    import torch
except ModuleNotFoundError as e:
    raise extras.reraise(e, "trainprof.torch.watch()") from None

from trainprof.contract import metrics as contract
from trainprof.training.health import reductions as r
from trainprof.training.health.state import HealthState

log = logging.getLogger("trainprof")

COLLECTIONS = (
    "gradients",
    "weights",
    "biases",
    "relu_output",
    "relu_input",
    "tanh_input",
    "sigmoid_input",
)
DEFAULT_SAVE_INTERVAL = 100
_ACTIVATIONS = {
    torch.nn.ReLU: ("relu_output", None),
    torch.nn.Tanh: ("tanh_input", r.TANH_BOUNDS),
    torch.nn.Sigmoid: ("sigmoid_input", r.SIGMOID_BOUNDS),
}


_P = ParamSpec("_P")


def _on_saving_steps(
    log: Callable[Concatenate[Watcher, _P], None],
) -> Callable[Concatenate[Watcher, _P], None]:
    """A `log_*` method of the training loop: it runs on saving steps only, and counts (never
    raises) what goes wrong inside it."""

    @functools.wraps(log)
    def on_saving_steps(self: Watcher, *args: _P.args, **kwargs: _P.kwargs) -> None:
        if not self.saving:
            return
        try:
            log(self, *args, **kwargs)
        except Exception:
            self.session._error()

    return on_saving_steps


class Watcher:
    """The hooks of one `watch()`; `close()` removes them."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        *,
        save_interval: int,
        collections: Iterable[str],
        include_regex: str | None,
        rtol: float,
        atol: float,
        threshold_inactivity: float,
        track_unchanged: bool,
        session: Any,
    ):
        if int(save_interval) < 1:
            raise ValueError(f"save_interval must be a positive integer, got {save_interval!r}")
        self.collections = tuple(collections)
        unknown = sorted(set(self.collections) - set(COLLECTIONS))
        if unknown:
            raise ValueError(
                f"unknown collection(s) {', '.join(unknown)}; expected some of "
                f"{', '.join(COLLECTIONS)}"
            )
        self.model = model
        self.optimizer = optimizer
        self.save_interval = int(save_interval)
        self.include = re.compile(include_regex) if include_regex else None
        self.rtol, self.atol = rtol, atol
        self.threshold_inactivity = threshold_inactivity
        self.track_unchanged = track_unchanged
        self.session = session
        self.step = 0
        self.saving = True
        self._forwards = 0
        self._ended = False
        # (collection, tensor name, reduction names, the reductions' values in parts)
        self._pending: list[tuple[str, str, tuple[str, ...], list[torch.Tensor]]] = []
        self._previous: dict[tuple[str, str], torch.Tensor] = {}
        self._before: dict[str, torch.Tensor] = {}
        self._classes: torch.Tensor | None = None
        self._inputs: tuple[float, torch.Tensor] | None = None
        self._tokens: torch.Tensor | None = None
        self._handles: list[Any] = []
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._install()

    # --- hooks ---------------------------------------------------------------------------

    def _install(self) -> None:
        hooks = self._handles
        hooks.append(self.model.register_forward_pre_hook(self._on_forward))
        if self.optimizer is not None:
            hooks.append(self.optimizer.register_step_pre_hook(self._before_optimizer))
            hooks.append(self.optimizer.register_step_post_hook(self._after_optimizer))
        elif "gradients" in self.collections:
            for name, p in self.params:
                hooks.append(p.register_post_accumulate_grad_hook(self._grad_hook(name)))
        for name, module in self.model.named_modules():
            kind = _ACTIVATIONS.get(type(module))
            if kind is None:
                continue
            collection, bounds = kind
            if collection in self.collections or (
                collection == "relu_output" and "relu_input" in self.collections
            ):
                hooks.append(
                    module.register_forward_hook(self._activation_hook(name, collection, bounds))
                )

    def publish(self) -> None:
        """Publish what was logged for the current step now rather than at the next forward
        (a loop about to be scraped or checkpointed; costs one host copy on a saving step)."""
        if self.saving:
            self._guard(self._flush)

    def close(self) -> None:
        """Remove the hooks (a pending save is published first)."""
        self._guard(self._flush)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if getattr(self.session, "watcher", None) is self:
            self.session.watcher = None

    def _guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception:
            self.session._error()

    def _on_forward(self, module, args) -> None:
        if not module.training:
            return
        if self.optimizer is None:
            self._guard(self._begin_step_without_optimizer)
            if self.saving:
                self._guard(self._reduce_weights)
        elif self._ended:
            self._ended = False
            self._guard(self._end_step)

    def _begin_step_without_optimizer(self) -> None:
        if self._forwards:
            self._end_step()
        self._forwards += 1

    def _before_optimizer(self, optimizer, args, kwargs) -> None:
        if self.saving:
            self._guard(self._reduce_before_update)

    def _after_optimizer(self, optimizer, args, kwargs) -> None:
        # The step ends at the next training forward, so what the loop logs after
        # optimizer.step() (the loss, predictions) still belongs to this step.
        if self.saving:
            self._guard(self._reduce_update)
            self._guard(self._flush)
        self._ended = True

    def _end_step(self) -> None:
        if self.saving:
            self._flush()
        self.step += 1
        self.saving = self.step % self.save_interval == 0

    def _grad_hook(self, name: str):
        def hook(p: torch.Tensor) -> None:
            if self.saving and p.grad is not None:
                self._guard(self._reduce, "gradients", name, p.grad)

        return hook

    def _activation_hook(self, name: str, collection: str, bounds):
        def hook(module, args, output) -> None:
            if self.saving and module.training:
                self._guard(self._reduce_activation, collection, name, args, output, bounds)

        return hook

    # --- reductions (on the device) --------------------------------------------------------

    def _collection_of(self, name: str) -> str:
        return "biases" if name.endswith("bias") else "weights"

    def _reduce(self, collection: str, name: str, t: torch.Tensor) -> None:
        parts = [r.stats(t)]
        keys: tuple[str, ...] = r.STATISTICS
        if collection == "gradients":
            parts.append(r.spread(t))
            keys = keys + ("spread",)
        if self.track_unchanged:
            key = (collection, name)
            previous = self._previous.get(key)
            if previous is not None:
                parts.append(r.allclose(t, previous, self.rtol, self.atol))
                keys = keys + ("allclose",)
            self._previous[key] = t.detach().clone()
        self._pending.append((collection, name, keys, parts))

    def _reduce_weights(self) -> None:
        for name, p in self.params:
            collection = self._collection_of(name)
            if collection in self.collections:
                self._reduce(collection, name, p)

    def _reduce_before_update(self) -> None:
        if "gradients" in self.collections:
            for name, p in self.params:
                if p.grad is not None:
                    self._reduce("gradients", name, p.grad)
        self._reduce_weights()
        for name, p in self.params:
            collection = self._collection_of(name)
            if collection in self.collections:
                # The copy kept for UnchangedTensor was taken just now: it serves here too.
                kept = self._previous.get((collection, name)) if self.track_unchanged else None
                self._before[name] = kept if kept is not None else p.detach().clone()

    def _reduce_update(self) -> None:
        for name, p in self.params:
            before = self._before.pop(name, None)
            if before is not None:
                collection = self._collection_of(name)
                ratio = r.update_ratio(before, p)
                self._pending.append((collection, name, ("update_ratio",), [ratio]))

    def _reduce_activation(self, collection, name, args, output, bounds) -> None:
        if collection == "relu_output":
            if "relu_output" in self.collections:
                value = r.dead_ratio(output, self.threshold_inactivity)
                self._pending.append((collection, name, ("dead_ratio",), [value]))
            if "relu_input" in self.collections and args:
                self._pending.append(("relu_input", name, ("variance",), [r.variance(args[0])]))
        elif args:
            values = [
                r.saturated_ratio(args[0], bounds, self.threshold_inactivity),
                r.variance(args[0]),
            ]
            self._pending.append((collection, name, ("saturated_ratio", "variance"), values))

    # --- what the training loop logs -------------------------------------------------------

    @_on_saving_steps
    def log_predictions(
        self, labels: torch.Tensor, predictions: torch.Tensor, argmax: bool | None = None
    ) -> None:
        """True classes and predictions (class ids, or scores: argmax over the last axis when
        `predictions` has one more axis than `labels`, or argmax=True)."""
        if argmax or (argmax is None and predictions.dim() > labels.dim()):
            predictions = predictions.argmax(dim=-1)
        pairs = r.confusion_pairs(labels, predictions, contract.MAX_CLASSES + 1)
        self._classes = pairs if self._classes is None else self._classes + pairs

    @_on_saving_steps
    def log_inputs(self, images: torch.Tensor) -> None:
        """A batch of inputs (N x C x ...): per-channel means for CheckInputImages."""
        sums = r.channel_sums(images, contract.MAX_CHANNELS)
        n = float(images.shape[0]) if images.dim() else 1.0
        if self._inputs is not None:
            n, sums = n + self._inputs[0], sums + self._inputs[1]
        self._inputs = (n, sums)

    @_on_saving_steps
    def log_tokens(self, ids: torch.Tensor) -> None:
        """A batch of token ids: positions and matches of the watched token values."""
        values = tuple(int(t) for t in self.session.health.token_matches)
        counts = r.token_counts(ids, values)
        self._tokens = counts if self._tokens is None else self._tokens + counts

    # --- publication ---------------------------------------------------------------------

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        classes, self._classes = self._classes, None
        inputs, self._inputs = self._inputs, None
        tokens, self._tokens = self._tokens, None
        parts = [part for _, _, _, values in pending for part in values]
        extra = [t for t in (classes, inputs[1] if inputs else None, tokens) if t is not None]
        if not parts and not extra:
            return
        # One concatenation on the device and one copy to the host: one synchronisation.
        flat = [p.reshape(-1) if p.dtype == torch.float32 else p.reshape(-1).float() for p in parts]
        flat += [t.reshape(-1).float() for t in extra]
        host = torch.cat(flat).cpu().tolist()
        now = time.time()
        session = self.session
        with session._lock:
            health = session.health
            if pending:
                health.observe_save(self.step, now)
            offset = 0
            for collection, name, keys, _ in pending:
                values = dict(zip(keys, host[offset : offset + len(keys)]))
                offset += len(keys)
                include = bool(self.include and self.include.search(f"{collection}/{name}"))
                health.observe_tensor(collection, name, values, include)
            if classes is not None:
                k = contract.MAX_CLASSES + 1
                counts = host[offset : offset + k * k]
                offset += k * k
                health.observe_classes(
                    {(i // k, i % k): n for i, n in enumerate(counts) if n}, self.step
                )
            if inputs is not None:
                sums = host[offset : offset + inputs[1].numel()]
                offset += inputs[1].numel()
                health.observe_inputs(inputs[0], dict(enumerate(sums)))
            if tokens is not None:
                counts = host[offset : offset + tokens.numel()]
                ids = tuple(int(t) for t in health.token_matches)
                health.observe_tokens(counts[0], dict(zip(ids, counts[1:])))


def watch(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    save_interval: int = DEFAULT_SAVE_INTERVAL,
    collections: Sequence[str] = COLLECTIONS,
    include_regex: str | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-8,
    threshold_inactivity: float = 1.0,
    track_unchanged: bool = True,
    loss_num_steps: Iterable[int] = contract.LOSS_NUM_STEPS,
    loss_delta: float = 0.01,
    token_values: Iterable[int] = (0,),
    rules_config: str | None = None,
) -> Watcher:
    """Watch `model` (and `optimizer`) for the tensor rules; returns the `Watcher`.

    `rtol`/`atol` are UnchangedTensor's, `threshold_inactivity` DeadRelu's and
    SaturatedActivation's (percent), `loss_num_steps` the LossNotDecreasing `num_steps`
    values evaluated, `loss_delta` Overtraining's `delta`, `token_values` NLPSequenceRatio's:
    they are computed here, so a rule configured with other values needs them passed here
    too (the rule compiler says so). `track_unchanged` keeps a copy of each watched tensor
    from the previous save for UnchangedTensor; turn it off to save that memory.

    `rules_config` (default: the one `trainprof.start()` was given, else
    `TRAINPROF_RULES_CONFIG`): a rule configuration file; the values its tensor rules need
    replace those keyword arguments (LossNotDecreasing's num_steps are added to
    `loss_num_steps`). An unreadable file is one warning, and the arguments are used.

    Raises ValueError for a bad collection name or save_interval (a programming error, at
    setup); errors inside the hooks are counted, never raised into the training loop.
    """

    from trainprof.training.session import current, health_settings

    session = current()
    rules_config = rules_config or session.rules_config or os.environ.get("TRAINPROF_RULES_CONFIG")
    settings = health_settings(rules_config) if rules_config else None
    if settings:
        loss_num_steps = tuple(sorted(set(loss_num_steps) | set(settings["loss_num_steps"])))
        token_values = tuple(sorted(set(token_values) | set(settings["token_values"])))
        rtol = settings.get("rtol", rtol)
        atol = settings.get("atol", atol)
        loss_delta = settings.get("loss_delta", loss_delta)
        threshold_inactivity = settings.get("threshold_inactivity", threshold_inactivity)

    with session._lock:
        session.health = HealthState(
            loss_num_steps=loss_num_steps, loss_delta=loss_delta, token_values=token_values
        )
    previous = getattr(session, "watcher", None)
    if previous is not None:
        previous.close()
    watcher = Watcher(
        model,
        optimizer,
        save_interval=save_interval,
        collections=collections,
        include_regex=include_regex,
        rtol=rtol,
        atol=atol,
        threshold_inactivity=threshold_inactivity,
        track_unchanged=track_unchanged,
        session=session,
    )
    session.watcher = watcher
    return watcher

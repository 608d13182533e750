"""What the framework callbacks share: frames opened and closed from hooks instead of `with`."""

from __future__ import annotations

import functools
from typing import Any

from trainprof.training import session as api


class HookTimeline:
    """The step, phase and between-steps frames of one training loop, driven by hooks.

    Framework hooks come as begin/end pairs, so frames are entered and exited by hand. A
    missing or repeated hook (an exception in the user's step, a loop cut short) closes what
    is open rather than leaving frames on the stack.
    """

    def __init__(self) -> None:
        self.step: Any = None
        self.phase: Any = None
        self.gap: Any = None
        self.gap_clean = False

    def begin_step(self, mode: str, samples: float | None = None) -> None:
        self.end_step()
        self.step = api.step(mode, samples=samples)
        self.step.__enter__()

    def end_step(self) -> None:
        self.end_phase()
        step, self.step = self.step, None
        if step is not None:
            step.__exit__(None, None, None)

    def cancel_step(self) -> None:
        """Drop the open step without counting it (it turned out not to be one)."""
        self.end_phase()
        step, self.step = self.step, None
        if step is not None:
            step.cancel()

    def switch_phase(self, name: str) -> None:
        self.end_phase()
        self.phase = api.phase(name)
        self.phase.__enter__()

    def end_phase(self) -> None:
        phase, self.phase = self.phase, None
        if phase is not None:
            phase.__exit__(None, None, None)

    def begin_gap(self, name: str = "dataloader") -> None:
        """Time until the next step begins, as `name`, unless `spoil_gap()` is called."""
        self.cancel_gap()
        self.gap = api.phase(name)
        self.gap.__enter__()
        self.gap_clean = True

    def spoil_gap(self) -> None:
        self.gap_clean = False

    def end_gap(self) -> None:
        gap, self.gap = self.gap, None
        if gap is None:
            return
        if self.gap_clean:
            gap.__exit__(None, None, None)
        else:
            gap.cancel()

    def cancel_gap(self) -> None:
        self.gap_clean = False
        self.end_gap()

    def close(self) -> None:
        self.cancel_gap()
        self.end_step()


def guarded(method):
    """Run a hook body, counting (never raising) what goes wrong inside it."""

    @functools.wraps(method)
    def hook(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception:
            api.current()._error()
            return None

    return hook


def batch_size(batch: Any) -> int | None:
    """The leading dimension of the first tensor-like in a batch (tuple, list, dict)."""
    seen = 0
    stack = [batch]
    while stack and seen < 64:
        item = stack.pop(0)
        seen += 1
        shape = getattr(item, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return None


def ensure_started(framework: str, version: str, start_kwargs: dict[str, Any]) -> None:
    if not api.current().started:
        start_kwargs.setdefault("framework", framework)
        start_kwargs.setdefault("framework_version", version)
        api.start(**start_kwargs)

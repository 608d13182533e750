"""The reductions the tensor rules need, computed where the tensor lives (torch, any device).

Each function returns a small 1-D float tensor on the tensor's own device; the caller
concatenates a save's results and copies them to the host once, so a save costs one
synchronisation and a step that saves nothing costs none. `trainprof replay` runs the same
functions on tensors read from SageMaker Debugger trials.

    >>> import torch
    >>> dict(zip(STATISTICS, stats(torch.tensor([0.0, -2.0, 2.0, float("nan")])).tolist()))
    ... # doctest: +NORMALIZE_WHITESPACE
    {'mean_abs': nan, 'nan': 1.0, 'inf': 0.0, 'zero_ratio': 0.25, 'variance': nan, 'l1': nan,
     'l2': nan}
"""

from __future__ import annotations

import array
import math

from trainprof import extras

try:
    import torch
except ModuleNotFoundError as e:
    raise extras.reraise(e, "the training-health reductions") from None

STATISTICS = ("mean_abs", "nan", "inf", "zero_ratio", "variance", "l1", "l2")
# SageMaker's SaturatedActivation bounds: an input outside them saturates the unit.
TANH_BOUNDS = (-9.4999, 9.4999)
SIGMOID_BOUNDS = (-23.0, 16.99999)
EPSILON = 1e-9
# Percentiles are taken over at most this many evenly spaced elements of a tensor, so a save
# of a large gradient costs a bounded sort.
SPREAD_SAMPLE = 100_000
_SPREAD_QUANTILES = (0.05, 0.95)


def stats(t: torch.Tensor) -> torch.Tensor:
    """mean |x|, NaN count, ±Inf count, zero fraction, variance (ddof 0), L1, L2."""
    x = t.detach()
    if not x.is_floating_point():
        x = x.float()
    x = x.reshape(-1)
    if x.numel() == 0:
        return torch.zeros(len(STATISTICS), device=x.device)
    x32 = x.float()
    a = x32.abs()
    return torch.stack(
        (
            a.mean(),
            torch.isnan(x32).sum(),  # counts: stack promotes them to float32, exactly
            torch.isinf(x32).sum(),
            (x32 == 0).float().mean(),
            x32.var(unbiased=False) if x32.numel() > 1 else torch.zeros((), device=x.device),
            a.sum(),
            torch.linalg.vector_norm(x32),
        )
    )


def allclose(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> torch.Tensor:
    """numpy.allclose(a, b, rtol, atol, equal_nan=False) as a 1-element tensor (1.0 or 0.0)."""
    if a.shape != b.shape:
        return torch.zeros(1, device=a.device)
    a, b = a.detach().float(), b.detach().float()
    return ((a - b).abs() <= atol + rtol * b.abs()).all().float().reshape(1)


def update_ratio(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """‖after − before‖₂ / (‖before‖₂ + 1e-9): SageMaker's WeightUpdateRatio."""
    before, after = before.detach().float(), after.detach().float()
    change = torch.linalg.vector_norm(after - before)
    return (change / (torch.linalg.vector_norm(before) + EPSILON)).reshape(1)


def unit_axis(t: torch.Tensor) -> int:
    """The axis of a layer's units: channels (axis 1) of N x C x ... images, else the last."""
    return 1 if t.dim() >= 4 else t.dim() - 1


def _inactive_units(active: torch.Tensor, threshold_inactivity: float) -> torch.Tensor:
    if active.dim() <= 1:
        fraction = active.float().mean().reshape(1)
    else:
        axis = unit_axis(active)
        dims = [d for d in range(active.dim()) if d != axis]
        # The mean of the 0/1 values, from a count instead of a float copy of the whole
        # activation: the same float32 number while a unit has under 2**24 positions.
        fraction = active.sum(dim=dims).float() / (active.numel() // active.shape[axis])
    return (fraction < threshold_inactivity / 100.0).float().mean().reshape(1)


def dead_ratio(relu_output: torch.Tensor, threshold_inactivity: float = 1.0) -> torch.Tensor:
    """Fraction of units active (> 0) in fewer than `threshold_inactivity` % of positions."""
    return _inactive_units(relu_output.detach() > 0, threshold_inactivity)


def saturated_ratio(
    activation_input: torch.Tensor, bounds: tuple[float, float], threshold_inactivity: float = 1.0
) -> torch.Tensor:
    """Fraction of units whose input is inside `bounds` in fewer than `threshold_inactivity` %
    of positions (outside them tanh/sigmoid is flat)."""
    x = activation_input.detach()
    return _inactive_units((x > bounds[0]) & (x < bounds[1]), threshold_inactivity)


def confusion_pairs(labels: torch.Tensor, predictions: torch.Tensor, classes: int) -> torch.Tensor:
    """Counts of (label, prediction) pairs as a flat classes x classes tensor (class ids
    outside 0..classes-1 land in the last row/column)."""
    labels = labels.detach().reshape(-1).long().clamp(0, classes - 1)
    predictions = predictions.detach().reshape(-1).long().clamp(0, classes - 1)
    return torch.bincount(labels * classes + predictions, minlength=classes * classes).float()


def channel_sums(images: torch.Tensor, channels: int) -> torch.Tensor:
    """Per channel (axis 1), the sum over samples of each sample's channel mean."""
    x = images.detach().float()
    if x.dim() < 2:
        x = x.reshape(-1, 1)
    per_sample = x.reshape(x.shape[0], x.shape[1], -1).mean(dim=2)
    return per_sample.sum(dim=0)[:channels]


def token_counts(ids: torch.Tensor, values: tuple[int, ...]) -> torch.Tensor:
    """[positions, matches of values[0], matches of values[1], ...]."""
    ids = ids.detach().reshape(-1)
    counts = [torch.tensor(float(ids.numel()), device=ids.device)]
    counts += [(ids == v).sum().float() for v in values]
    return torch.stack(counts)


def variance(t: torch.Tensor) -> torch.Tensor:
    """Population variance (ddof 0) of all elements, as a 1-element tensor."""
    x = t.detach().float().reshape(-1)
    if x.numel() < 2:
        return torch.zeros(1, device=x.device)
    return x.var(unbiased=False).reshape(1)


def _float32(value: float) -> float:
    """`value` rounded to the nearest float32, as torch's float32 arithmetic rounds."""
    return array.array("f", (value,))[0]


def spread(t: torch.Tensor) -> torch.Tensor:
    """95th minus 5th percentile of the elements (PoorWeightInitialization's gradient
    distribution range), over an even sample of at most SPREAD_SAMPLE elements.

    Exactly what `torch.quantile(x, [0.05, 0.95])` gives (linear interpolation between the
    order statistics, NaN when any element is NaN), from the two tails `torch.topk` selects
    rather than a sort of the whole tensor: a third of the time at 64k elements.

    >>> x = torch.arange(101.0)
    >>> float(spread(x)), float(torch.quantile(x, 0.95) - torch.quantile(x, 0.05))
    (90.0, 90.0)
    """
    x = t.detach().float().reshape(-1)
    n = x.numel()
    if n == 0:
        return torch.zeros(1, device=x.device)
    if n > SPREAD_SAMPLE:
        x = x[:: -(-n // SPREAD_SAMPLE)]
        n = x.numel()
    # The ranks as torch.quantile computes them, in float32, here on the host (no sync).
    ranks = [_float32(_float32(q) * (n - 1)) for q in _SPREAD_QUANTILES]
    below, above = [int(r) for r in ranks], [math.ceil(r) for r in ranks]
    weights = [r - b for r, b in zip(ranks, below)]  # exact in float32
    smallest = torch.topk(x, above[0] + 1, largest=False).values  # ascending
    largest = torch.topk(x, n - below[1], largest=True).values  # descending: [j] is n-1-j
    low = torch.lerp(smallest[below[0]], smallest[above[0]], weights[0])
    high = torch.lerp(largest[n - 1 - below[1]], largest[n - 1 - above[1]], weights[1])
    result = (high - low).reshape(1)
    # topk ranks NaN above everything: the largest element is NaN exactly when one is.
    top = largest[:1]
    return torch.where(torch.isnan(top), top, result)

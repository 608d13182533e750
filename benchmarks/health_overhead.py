"""Per-step cost of `trainprof.torch.watch` on a small CNN and a small transformer (CPU).

    .venv/bin/python benchmarks/health_overhead.py [--steps 100] [--rounds 7] [--markdown]
        [--models cnn transformer mlp]

For each model, the same training loop (forward, loss, backward, SGD step, log_loss,
log_predictions) runs uninstrumented and watched with save_interval 1, 10 and 100, every
collection on (gradients, weights, biases, relu_output, ...) and UnchangedTensor's copies kept.
Variants are interleaved (each of --rounds rounds runs every variant once, --steps steps,
timed on this thread's CPU time with one torch thread, so other processes on a shared
machine do not count) and each is reported as the median ms per step with min and max,
and its overhead against the uninstrumented loop as the median of the per-round ratios
(min and max). Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import time

import torch
from _interleave import Spread, caption, ratios, rounds

import trainprof
import trainprof.torch as tt


def small_cnn() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 10),
    )
    return model, torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))


class SmallTransformer(torch.nn.Module):
    def __init__(self, vocab=1000, d=64, classes=10):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        layer = torch.nn.TransformerEncoderLayer(d, 4, 128, batch_first=True, dropout=0.0)
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(d, classes)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids)).mean(dim=1))


def tiny_mlp():
    """So small that the hooks' fixed cost per step shows (save_interval=100 saves once)."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    return model, torch.randn(2, 4), torch.tensor([0, 1])


def small_transformer():
    return SmallTransformer(), torch.randint(0, 1000, (16, 64)), torch.randint(0, 10, (16,))


def run(build, steps: int, save_interval: int | None) -> float:
    torch.manual_seed(0)
    model, x, y = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    watcher = tt.watch(model, opt, save_interval=save_interval) if save_interval else None

    def one_step():
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        if watcher is not None:
            trainprof.log_loss(loss)
            watcher.log_predictions(y, out)
        opt.zero_grad()

    for _ in range(5):
        one_step()
    start = time.thread_time()
    for _ in range(steps):
        one_step()
    elapsed = time.thread_time() - start
    if watcher is not None:
        watcher.close()
    trainprof.stop()
    return elapsed / steps * 1e3


MODELS = {
    "mlp": ("tiny MLP (2 Linear, 1 ReLU; batch 2)", tiny_mlp, 20),
    "cnn": ("small CNN (2 conv, 2 ReLU, 1 Linear; batch 32 x 3 x 32 x 32)", small_cnn, 1),
    "transformer": (
        "small transformer (2 encoder layers, d 64; batch 16 x 64 tokens)",
        small_transformer,
        1,
    ),
}
INTERVALS = (None, 100, 10, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--markdown", action="store_true", help="a table for the README")
    args = parser.parse_args()
    torch.set_num_threads(1)
    what = (
        f"health_overhead.py: ms of CPU per training step, torch {torch.__version__}, 1 thread, "
        f"{args.rounds} interleaved rounds of {args.steps} steps"
    )
    print(caption(what) + ("\n" if args.markdown else ""))
    if args.markdown:
        print("| model | uninstrumented | save_interval=100 | save_interval=10 | save_interval=1 |")
        print("|---|---|---|---|---|")
    else:
        print(f"{'model':<18}{'variant':<20}{'ms/step (min-max)':>26}{'x uninstrumented':>24}")
    for key in args.models:
        label, build, scale = MODELS[key]
        steps = args.steps * scale

        def variant(interval, build=build, steps=steps):
            return lambda: run(build, steps, interval)

        results = rounds([(str(i), variant(i)) for i in INTERVALS], args.rounds)
        cells = []
        for interval in INTERVALS:
            ms = Spread(results[str(interval)])
            if interval is None:
                cells.append((f"{ms.cell('{:.3f}')}", "uninstrumented", ""))
                continue
            ratio = ratios(results, str(interval), "None")
            cells.append((ms.cell("{:.3f}"), f"save_interval={interval}", ratio.cell("{:.3f}")))
        if args.markdown:
            row = [cells[0][0]] + [f"{ms}, x{ratio}" for ms, _, ratio in cells[1:]]
            print(f"| {label} | " + " | ".join(row) + " |", flush=True)
        else:
            for ms, name, ratio in cells:
                print(f"{key:<18}{name:<20}{ms:>26}{ratio:>24}", flush=True)


if __name__ == "__main__":
    main()

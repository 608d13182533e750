"""Per-step cost of `trainprof.torch.watch` on a small CNN and a small transformer (CPU).

    .venv/bin/python benchmarks/health_overhead.py [--steps 100] [--repeat 5]

For each model, the same training loop (forward, loss, backward, SGD step, log_loss,
log_predictions) runs uninstrumented and watched with save_interval 1, 10 and 100, every
collection on (gradients, weights, biases, relu_output, ...) and UnchangedTensor's copies kept.
Variants are interleaved (each of --repeat rounds runs every variant once) and the best round
of each is reported in milliseconds per step, with the overhead against the uninstrumented
loop. One torch thread, so the rows of one run compare on a shared machine.
Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

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
    start = time.perf_counter()
    for _ in range(steps):
        one_step()
    elapsed = time.perf_counter() - start
    if watcher is not None:
        watcher.close()
    trainprof.stop()
    return elapsed / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, 1 thread")
    print(f"{'model':<18}{'variant':<20}{'ms/step':>10}{'overhead':>10}")
    intervals = (None, 100, 10, 1)
    models = (
        ("tiny MLP", tiny_mlp),
        ("small CNN", small_cnn),
        ("small transformer", small_transformer),
    )
    for name, build in models:
        # Interleaved: each round runs every variant once, so a busy neighbour slows all
        # variants of a round alike; the best round of each variant is reported.
        best = dict.fromkeys(intervals, float("inf"))
        steps = args.steps * 20 if build is tiny_mlp else args.steps
        for _ in range(args.repeat):
            for interval in intervals:
                best[interval] = min(best[interval], run(build, steps, interval))
        base = best[None]
        for interval in intervals:
            label = "uninstrumented" if interval is None else f"save_interval={interval}"
            overhead = "" if interval is None else f"{(best[interval] / base - 1) * 100:+.1f}%"
            print(f"{name:<18}{label:<20}{best[interval]:>10.3f}{overhead:>10}", flush=True)


if __name__ == "__main__":
    main()

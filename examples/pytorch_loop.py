"""A plain PyTorch training loop instrumented with trainprof.

    python examples/pytorch_loop.py                       # one process, serves :9946/metrics
    torchrun --nproc-per-node 2 examples/pytorch_loop.py  # ranks serve :9946 and :9947
    curl -s localhost:9946/metrics | grep trainprof_training_steps_total

Runs on the CPU (or the GPU of its local rank) with a synthetic dataset, for --steps steps,
then keeps serving for --linger seconds so Prometheus can take a last scrape.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import trainprof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--linger", type=float, default=0.0)
    args = parser.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)

    # Identity (job, node, rank) comes from torchrun / SLURM / TRAINPROF_* variables.
    session = trainprof.start()
    print(f"rank {session.identity.rank}: metrics on port {session.port}", flush=True)

    features = torch.randn(args.steps * args.batch_size, 64)
    targets = features @ torch.randn(64, 1)
    dataset = torch.utils.data.TensorDataset(features, targets)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=2
    )
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for x, y in trainprof.data(loader):  # phase "dataloader"
        with trainprof.step(samples=len(x)):  # steps, durations, outliers
            with trainprof.phase("h2d"):
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with trainprof.phase("forward"):
                loss = torch.nn.functional.mse_loss(model(x), y)
            with trainprof.phase("backward"):
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
            with trainprof.phase("optimizer"):
                optimizer.step()

    with trainprof.step(mode="eval"), torch.no_grad():
        model(features[: args.batch_size].to(device))

    print(
        f"rank {session.identity.rank}: "
        f"{session.value('trainprof_training_steps_total', mode='train'):.0f} steps, "
        f"final loss {loss.item():.4f}",
        flush=True,
    )
    time.sleep(args.linger)


if __name__ == "__main__":
    main()

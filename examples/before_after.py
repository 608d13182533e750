"""A real before/after pair for `trainprof compare`: one small training job run twice, before
and after fixing its input pipeline.

    python examples/before_after.py before OUT/before    # augments each image in Python
    python examples/before_after.py after OUT/after      # augments the whole batch at once
    trainprof compare OUT/before OUT/after -o compare.html
    trainprof compare OUT/before/trace.pt.trace.json.gz OUT/after/trace.pt.trace.json.gz

Each run trains a small convolutional network on the CPU (synthetic 3x32x32 images) with
trainprof's training API recording its steps and phases (`start(record=...)`), `trainprof
record` sampling the host beside it, and torch.profiler tracing three steps (steps 30-32; the
last is cut short, as a profiler usually leaves it). "before" blurs and jitters each image
in its own Python call inside the dataset, the usual slow input pipeline; "after" does the
same arithmetic on the whole batch in one call. Writes OUT/rank0.jsonl.gz,
OUT/host.jsonl.gz and OUT/trace.pt.trace.json.gz.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import signal
import subprocess
import sys
import time

import torch

import trainprof

JOB = "cifar-small"
POOL = 2048  # distinct images, read over and over
KERNEL = torch.tensor([[1.0, 2.0, 1.0], [2.0, 4.0, 2.0], [1.0, 2.0, 1.0]]) / 16


def augment(images: torch.Tensor) -> torch.Tensor:
    """A 3x3 blur of every channel and a little brightness jitter (N, 3, 32, 32)."""
    weight = KERNEL.expand(3, 1, 3, 3)
    blurred = torch.nn.functional.conv2d(images, weight, padding=1, groups=3)
    return blurred * (1 + 0.05 * torch.randn(images.shape[0], 1, 1, 1))


class Images(torch.utils.data.Dataset):
    """`count` synthetic labelled images (POOL of them, repeated); `per_sample` augments
    each one as it is read."""

    def __init__(self, count: int, per_sample: bool):
        generator = torch.Generator().manual_seed(0)
        self.images = torch.randn(POOL, 3, 32, 32, generator=generator)
        self.labels = torch.randint(0, 10, (POOL,), generator=generator)
        self.count = count
        self.per_sample = per_sample

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        image = self.images[i % POOL]
        if self.per_sample:
            for _ in range(4):  # the slow pipeline: four small passes per image
                image = augment(image[None])[0]
        return image, self.labels[i % POOL]


def model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(32 * 16, 10),
    )


def train(args: argparse.Namespace) -> torch.Tensor:
    """The training loop, recorded by trainprof and traced by torch.profiler."""
    time.sleep(2)  # the host's first samples before the job starts
    trainprof.start(
        serve=False,
        record=os.path.join(args.out, "rank0.jsonl.gz"),
        training_job=JOB,
        node="laptop",
        rank=0,
        world_size=1,
    )
    per_sample = args.variant == "before"
    data = Images(args.steps * args.batch_size, per_sample)
    loader = torch.utils.data.DataLoader(data, batch_size=args.batch_size, shuffle=True)
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    traced = os.path.join(args.out, "trace.pt.trace.json")
    profiler = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=29, warmup=1, active=3, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(traced),
    )
    batches = iter(loader)
    with profiler:
        for _ in range(len(loader)):
            # A step is one whole iteration: fetching the batch (where "before" augments
            # each image) and training on it (where "after" augments the batch).
            with trainprof.step(samples=args.batch_size):
                with trainprof.phase("dataloader"):
                    images, labels = next(batches)
                if not per_sample:
                    with trainprof.phase("augment"):
                        images = augment(augment(augment(augment(images))))
                with trainprof.phase("forward"):
                    loss = torch.nn.functional.cross_entropy(net(images), labels)
                with trainprof.phase("backward"):
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                with trainprof.phase("optimizer"):
                    optimizer.step()
            profiler.step()
    trainprof.stop()
    return loss


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("variant", choices=("before", "after"))
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)

    host = subprocess.Popen(
        [sys.executable, "-m", "trainprof.cli", "record", os.path.join(args.out, "host.jsonl.gz")]
        + ["--web.listen-address", "127.0.0.1:0", "--no-collector.gpu"]
        + ["--identity.node", "laptop", "--identity.training-job", JOB],
    )
    try:
        loss = train(args)
    finally:
        time.sleep(1.5)  # the host's last samples after the job ends
        host.send_signal(signal.SIGTERM)
        host.wait(timeout=30)
    traced = os.path.join(args.out, "trace.pt.trace.json")
    with open(traced, "rb") as src, gzip.open(traced + ".gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    os.remove(traced)
    print(f"{args.variant}: {args.steps} steps, final loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()

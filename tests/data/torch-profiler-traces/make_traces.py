"""Write the traces in this folder with torch.profiler itself (PyTorch 2.13, CPU only):

    python tests/data/torch-profiler-traces/make_traces.py tests/data/torch-profiler-traces

Each is what a user's own profiling loop writes, kept small (a two-layer model, a few steps):

- cpu-steps-cut-short.pt.trace.json.gz: the usual loop, `with profile(schedule=...) as p:
  ... p.step()`, left while a step is recording (the last ProfilerStep#N is cut short),
  with `record_function` annotations, shapes and memory events (`[memory]` instant events);
- cpu-one-step.pt.trace.json: one profiled step, written as plain JSON (not gzip);
- cpu-no-steps.pt.trace.json.gz: `with profile():` around a forward pass, no steps at all;
- cpu-gloo-rank0/1.pt.trace.json.gz: two processes training with DistributedDataParallel
  over gloo, one trace per rank (`distributedInfo` names the rank), with the stack
  (`python_function` events).

Uses only torch (and the standard library); nothing from trainprof.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, record_function, schedule

torch.manual_seed(0)


def model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))


def train_step(net: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    x, y = torch.randn(16, 32), torch.randn(16, 4)
    with record_function("forward"):
        loss = torch.nn.functional.mse_loss(net(x), y)
    with record_function("backward"):
        optimizer.zero_grad()
        loss.backward()
    optimizer.step()


def cut_short(out: Path) -> None:
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=5),
        record_shapes=True,
        profile_memory=True,
        on_trace_ready=lambda p: p.export_chrome_trace(
            str(out / "cpu-steps-cut-short.pt.trace.json.gz")
        ),
    ) as p:
        for _ in range(6):  # steps 0..5; the loop ends while step 6 records: cut short
            train_step(net, optimizer)
            p.step()
        train_step(net, optimizer)  # no p.step() after it: the with stops the profiler


def one_step(out: Path) -> None:
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    with profile(
        activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=0, active=1)
    ) as p:
        train_step(net, optimizer)
        p.step()
    p.export_chrome_trace(str(out / "cpu-one-step.pt.trace.json"))


def no_steps(out: Path) -> None:
    net = model()
    with profile(activities=[ProfilerActivity.CPU]) as p:
        net(torch.randn(8, 32))
    p.export_chrome_trace(str(out / "cpu-no-steps.pt.trace.json.gz"))


def _rank(rank: int, world: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    net = torch.nn.parallel.DistributedDataParallel(model())
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    trace = Path(out) / f"cpu-gloo-rank{rank}.pt.trace.json.gz"
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=0, warmup=1, active=3),
        with_stack=True,
        on_trace_ready=lambda p: p.export_chrome_trace(str(trace)),
    ) as p:
        for _ in range(4):
            train_step(net, optimizer)
            p.step()
    dist.destroy_process_group()


def gloo(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        mp.spawn(_rank, args=(2, init, str(out)), nprocs=2, join=True)


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    cut_short(target)
    one_step(target)
    no_steps(target)
    gloo(target)

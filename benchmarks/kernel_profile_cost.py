"""Cost of `trainprof.start(kernel_profile=...)`: a profiled window, and amortised per step.

    .venv/bin/python benchmarks/kernel_profile_cost.py [--windows 5] [--window-steps 20]

A small CPU model (3 linear layers, batch 64) trains; torch.profiler records CPU operators
only here (no GPU), so the window cost is the profiler's host-side cost, the part a GPU job
pays on its training thread too (CUPTI's device-side buffers add to it on a GPU).

    outside windows   ns per empty step, kernel_profile off vs on between windows
    window            extra time of the steps inside a window over the same steps unprofiled,
                      and the training thread's own start/stop/step calls
    background        the background thread's export (gzip) + read + aggregation per window
    amortised         (window extra + background) / steps per 10 minutes at the default
                      schedule (20 steps every 10 minutes), per step and as % of a step

Not a test: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
import timeit
from time import perf_counter


def model_step(model, opt, batch):
    model(batch).sum().backward()
    opt.step()
    opt.zero_grad()


def empty_steps(n: int) -> float:
    import trainprof

    step = trainprof.step
    t0 = perf_counter()
    for _ in range(n):
        with step():
            pass
    return (perf_counter() - t0) / n * 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--window-steps", type=int, default=20)
    parser.add_argument("--empty-steps", type=int, default=200_000)
    args = parser.parse_args()

    import torch

    import trainprof

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch = torch.randn(64, 512)

    # outside windows: the hot path with the profiler configured but not due, alternating
    # off and on runs so both see the same load
    directory = tempfile.mkdtemp(prefix="trainprof-bench-")
    never = f"steps={args.window_steps},every=1h,first=1000000000,keep=3,dir={directory}"
    off, between = [], []
    for _ in range(3):
        trainprof.start(serve=False, training_job="bench")
        off.append(empty_steps(args.empty_steps))
        trainprof.stop()
        trainprof.start(serve=False, training_job="bench", kernel_profile=never)
        between.append(empty_steps(args.empty_steps))
        trainprof.stop()
    off_ns, between_ns = min(off), min(between)
    session = trainprof.start(serve=False, training_job="bench", kernel_profile=never)
    hook = session._kernel.step_ended
    hook_ns = min(timeit.repeat(hook, number=1_000_000, repeat=3)) * 1e3
    kernel = session._kernel

    background: list[float] = []
    aggregate = kernel._aggregate

    def timed_aggregate(*a):
        t0 = perf_counter()
        aggregate(*a)
        background.append(perf_counter() - t0)

    kernel._aggregate = timed_aggregate

    def run(n: int) -> list[float]:
        times = []
        for _ in range(n):
            t0 = perf_counter()
            with trainprof.step():
                model_step(model, opt, batch)
            times.append(perf_counter() - t0)
        return times

    run(30)  # warm-up
    plain: list[float] = []
    windows: list[float] = []
    for _ in range(args.windows):
        plain.append(sum(run(args.window_steps + 1)))
        kernel._next = time.monotonic()  # due now: the next step's end opens a window
        kernel._seen = kernel.config.first
        windows.append(sum(run(args.window_steps + 1)))  # opening step + window steps
        kernel.wait_idle()
    overhead_calls = session.value("trainprof_kernel_profile_overhead_seconds_total")
    trainprof.stop()

    step_time = statistics.median(plain) / (args.window_steps + 1)
    extra = statistics.median([w - p for w, p in zip(windows, plain)])
    bg = statistics.median(background)
    steps_per_10min = 600.0 / step_time
    amortised = (extra + bg) / steps_per_10min
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, CPU only")
    print(
        f"outside windows: {off_ns:.0f} ns/empty step off, {between_ns:.0f} ns on; the step "
        f"hook alone {hook_ns:.0f} ns per call"
    )
    print(f"step time unprofiled: {step_time * 1e3:.2f} ms")
    print(
        f"window of {args.window_steps} steps: +{extra * 1e3:.1f} ms on the training thread "
        f"({extra / (args.window_steps * step_time):.0%} of the window's steps); start/stop/step "
        f"calls {overhead_calls / args.windows * 1e3:.1f} ms per window"
    )
    print(f"background per window (export gzip + read + aggregate): {bg * 1e3:.0f} ms")
    print(
        f"amortised at 20 steps / 10 min: {amortised * 1e6:.1f} us per step "
        f"({amortised / step_time:.4%} of a step; {(extra + bg) / 600:.4%} of wall time), "
        f"{steps_per_10min:.0f} steps per 10 min"
    )


if __name__ == "__main__":
    main()

"""Overhead of `with trainprof.step()` plus three phases, beside its floor and its peers.

    .venv/bin/python benchmarks/step_overhead.py [--steps 5000] [--rounds 100] [--markdown]

Each variant runs the same loop body: one step block with three phase blocks inside and
nothing else, so the numbers are the instrumentation's own cost per training step:

    floor             a hand-written context manager (`__slots__`, `__enter__` and `__exit__`
                      each reading time.perf_counter_ns, the exit adding the elapsed time to
                      a total) for each of the four blocks: the least a timer can cost
    trainprof         trainprof.step() and trainprof.phase(), a started session not serving
    trainprof+scrape  the same while another thread scrapes /metrics every 10 ms
    record_function   torch.profiler.record_function for each block, no profiler active
    Histogram.time()  prometheus_client's Histogram(...).labels(...).time() for each block
    nullcontext       contextlib.nullcontext() for each block

Variants are interleaved (each round runs every variant for --steps steps) and timed with
this thread's CPU time, so time the machine gives to other processes does not count.
Reported: the median ns per step over the rounds with min and max, and each variant's ratio
to the floor taken round by round. Not a test: compare the rows of one run.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
import urllib.request
from collections.abc import Callable

from _interleave import Spread, caption, ratios, rounds


class FloorTimer:
    """The floor: what timing a block takes at the very least in Python."""

    __slots__ = ("start", "total")

    def __init__(self) -> None:
        self.start = 0
        self.total = 0

    def __enter__(self) -> FloorTimer:
        self.start = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> bool:
        self.total += time.perf_counter_ns() - self.start
        return False


def floor_loop(n: int) -> None:
    step, forward, backward, optimizer = FloorTimer(), FloorTimer(), FloorTimer(), FloorTimer()
    for _ in range(n):
        with step:
            with forward:
                pass
            with backward:
                pass
            with optimizer:
                pass


def nullcontext_loop(n: int) -> None:
    null = contextlib.nullcontext
    for _ in range(n):
        with null():
            with null():
                pass
            with null():
                pass
            with null():
                pass


def record_function_loop(n: int) -> None:
    from torch.profiler import record_function

    for _ in range(n):
        with record_function("step"):
            with record_function("forward"):
                pass
            with record_function("backward"):
                pass
            with record_function("optimizer"):
                pass


def histogram_loop() -> Callable[[int], None]:
    from prometheus_client import CollectorRegistry, Histogram

    h = Histogram("block_seconds", "Block time", ["block"], registry=CollectorRegistry())
    step, fwd, bwd, opt = (h.labels(b) for b in ("step", "forward", "backward", "optimizer"))

    def loop(n: int) -> None:
        for _ in range(n):
            with step.time():
                with fwd.time():
                    pass
                with bwd.time():
                    pass
                with opt.time():
                    pass

    return loop


def trainprof_loop(n: int) -> None:
    import trainprof

    step, phase = trainprof.step, trainprof.phase
    for _ in range(n):
        with step():
            with phase("forward"):
                pass
            with phase("backward"):
                pass
            with phase("optimizer"):
                pass


def per_step(loop: Callable[[int], None], steps: int) -> Callable[[], float]:
    """A measurement: ns of this thread's CPU per step over `steps` steps."""

    def measure() -> float:
        t0 = time.thread_time_ns()
        loop(steps)
        return (time.thread_time_ns() - t0) / steps

    loop(min(steps, 1000))  # warm up: imports, caches, first-step work
    return measure


@contextlib.contextmanager
def scraping(port: int):
    stop = threading.Event()
    scrapes = [0]

    def scrape() -> None:
        while not stop.wait(0.01):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                r.read()
            scrapes[0] += 1

    thread = threading.Thread(target=scrape, daemon=True)
    thread.start()
    try:
        yield scrapes
    finally:
        stop.set()
        thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000, help="steps per variant per round")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--markdown", action="store_true", help="a table for the README")
    args = parser.parse_args()

    import torch

    import trainprof

    steps = args.steps
    # Started first: the scraped variant times the same session the other one does.
    session = trainprof.start(port=0, addr="127.0.0.1")
    variants = [
        ("floor", per_step(floor_loop, steps)),
        ("trainprof", per_step(trainprof_loop, steps)),
        ("record_function", per_step(record_function_loop, steps)),
        ("Histogram.time()", per_step(histogram_loop(), steps)),
        ("nullcontext", per_step(nullcontext_loop, steps)),
    ]
    results = rounds(variants, args.rounds)
    with scraping(session.port) as scrapes:
        scraped = rounds(
            [("floor", variants[0][1]), ("trainprof+scrape", per_step(trainprof_loop, steps))],
            max(args.rounds // 4, 3),
        )
    trainprof.stop()
    rows = [(name, Spread(results[name]), ratios(results, name, "floor")) for name in results]
    rows.insert(
        2,
        (
            "trainprof+scrape",
            Spread(scraped["trainprof+scrape"]),
            ratios(scraped, "trainprof+scrape", "floor"),
        ),
    )
    what = (
        f"step_overhead.py: ns of CPU per step + 3 phases, torch {torch.__version__}, "
        f"{args.rounds} interleaved rounds of {steps} steps"
    )
    if args.markdown:
        print(caption(what) + "\n")
        print("| variant | ns per step, median (min-max) | x floor, median (min-max) |")
        print("|---|---|---|")
        for name, ns, ratio in rows:
            print(f"| {name} | {ns.cell('{:.0f}')} | {ratio.cell('{:.2f}')} |")
    else:
        print(caption(what))
        print(f"{'variant':<18} {'ns/step median (min-max)':>28} {'x floor (min-max)':>22}")
        for name, ns, ratio in rows:
            print(f"{name:<18} {ns.cell('{:.0f}'):>28} {ratio.cell('{:.2f}'):>22}")
    print(f"\n(scraped /metrics {scrapes[0]} times during the trainprof+scrape rounds)")


if __name__ == "__main__":
    main()

"""Overhead of `with trainprof.step()` plus three phases, beside the alternatives, in one run.

    .venv/bin/python benchmarks/step_overhead.py [--steps 200000] [--repeat 5]

Each variant runs the same loop body: one step block with three phase blocks inside and
nothing else, so the numbers are the instrumentation's own cost per training step:

    nullcontext       contextlib.nullcontext() for each of the four blocks (the floor)
    record_function   torch.profiler.record_function for each block, no profiler active
    trainprof         trainprof.step() and trainprof.phase(), a started session not serving
    trainprof+scrape  the same while another thread scrapes /metrics every 10 ms

The best of --repeat runs is reported, in nanoseconds per step (lower is better). Not a test:
timings depend on the machine; compare the rows of one run.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import threading
import time
import urllib.request


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


def best_ns_per_step(loop, steps: int, repeat: int) -> float:
    loop(min(steps, 10_000))  # warm up: imports, caches
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        loop(steps)
        best = min(best, time.perf_counter() - t0)
    return best / steps * 1e9


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
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    import torch

    import trainprof

    rows = [
        ("nullcontext", best_ns_per_step(nullcontext_loop, args.steps, args.repeat)),
        ("record_function", best_ns_per_step(record_function_loop, args.steps, args.repeat)),
    ]
    trainprof.start(serve=False)
    rows.append(("trainprof", best_ns_per_step(trainprof_loop, args.steps, args.repeat)))
    trainprof.stop()
    session = trainprof.start(port=0, addr="127.0.0.1")
    with scraping(session.port) as scrapes:
        rows.append(("trainprof+scrape", best_ns_per_step(trainprof_loop, args.steps, args.repeat)))
    trainprof.stop()

    print(
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"{platform.machine()}, {args.steps} steps x best of {args.repeat}"
    )
    print(f"{'variant':<18} {'ns/step':>9} {'x nullcontext':>14}")
    for name, ns in rows:
        print(f"{name:<18} {ns:>9.0f} {ns / rows[0][1]:>14.1f}")
    print(f"(scraped /metrics {scrapes[0]} times during the last row)")


if __name__ == "__main__":
    main()

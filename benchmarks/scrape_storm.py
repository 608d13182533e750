"""A training loop's steps per second with and without a scrape storm on its own /metrics.

    python benchmarks/scrape_storm.py [--seconds 8] [--scrapers 50] [--half-open 500]

The trainer (a subprocess) runs `trainprof.start()` and a loop of steps with three phases
and a fixed piece of Python work each, and prints every second how many steps it made and
how many threads it has. After a calm period, a second process opens `--half-open`
connections that never send a request and runs `--scrapers` threads scraping the rank's
/metrics back to back on kept-alive connections; then the storm stops and the loop is
measured calm again. Both processes share this machine's cores, as a sidecar would; a storm
from other machines costs the trainer only its own serving. On a machine shared with other
work, steps per second move with the neighbours; the CPU the trainer's other threads (its
/metrics server) take from the loop is the steadier figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

from _procs import free_port, stop, wait_ready

TRAINER = """
import sys, threading, time
import trainprof
trainprof.start(port=int(sys.argv[1]), addr="127.0.0.1", training_job="storm")
work = list(range(200))
next_report = time.monotonic() + 1
steps = 0
loop_cpu, process_cpu = time.thread_time(), time.process_time()
while True:
    with trainprof.step(samples=32):
        with trainprof.phase("forward"):
            sum(x * x for x in work)
        with trainprof.phase("backward"):
            sum(x + 1 for x in work)
        with trainprof.phase("optimizer"):
            pass
    steps += 1
    now = time.monotonic()
    if now >= next_report:
        loop, process = time.thread_time(), time.process_time()
        # CPU seconds of the loop's thread, and of every other thread (the server's)
        print(steps, threading.active_count(), loop - loop_cpu,
              (process - process_cpu) - (loop - loop_cpu), flush=True)
        steps, loop_cpu, process_cpu = 0, loop, process
        next_report += 1
"""

STORM = """
import http.client, socket, sys, threading, time
port, scrapers, half_open, seconds = (int(a) for a in sys.argv[1:5])
idle = []
for _ in range(half_open):
    try:
        idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    except OSError:
        break
stop = time.monotonic() + seconds
done = [0] * scrapers
failed = [0] * scrapers
def scrape(i):
    conn = None
    while time.monotonic() < stop:
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            r = conn.getresponse()
            r.read()
            if r.status == 200:
                done[i] += 1
            else:
                failed[i] += 1
        except Exception:
            failed[i] += 1
            conn = None
threads = [threading.Thread(target=scrape, args=(i,)) for i in range(scrapers)]
for t in threads: t.start()
for t in threads: t.join()
print(len(idle), sum(done), sum(failed), flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=8, help="length of each period")
    parser.add_argument("--scrapers", type=int, default=50)
    parser.add_argument("--half-open", type=int, default=500)
    args = parser.parse_args()

    port = free_port()
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=os.environ,
    )
    lines: list[tuple[float, int, int, float, float]] = []

    def read() -> None:
        assert trainer.stdout is not None
        for line in trainer.stdout:
            steps, threads, loop, serving = line.split()
            lines.append((time.monotonic(), int(steps), int(threads), float(loop), float(serving)))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_ready(f"http://127.0.0.1:{port}/metrics", trainer)
        time.sleep(2)  # warm up
        calm_from = time.monotonic()
        time.sleep(args.seconds)
        storm_from = time.monotonic()
        storm = subprocess.run(
            [sys.executable, "-c", STORM, str(port), str(args.scrapers), str(args.half_open)]
            + [str(args.seconds)],
            capture_output=True,
            text=True,
            timeout=args.seconds + 120,
        )
        storm_to = time.monotonic()
        time.sleep(args.seconds)
        after_to = time.monotonic()
    finally:
        stop(trainer)
    half_open, scrapes, failures = (int(v) for v in storm.stdout.split())

    def period(start: float, end: float) -> tuple[float, int, float, float]:
        inside = [line[1:] for line in lines if start + 1 < line[0] <= end]
        return (
            statistics.mean(s for s, _, _, _ in inside),
            max(t for _, t, _, _ in inside),
            statistics.mean(loop for _, _, loop, _ in inside),
            statistics.mean(serving for _, _, _, serving in inside),
        )

    def show(name: str, values: tuple[float, int, float, float]) -> str:
        steps, threads, loop, serving = values
        return (
            f"{name:<12}{steps:9.0f} steps/s ({steps / loop:,.0f} per loop CPU-second), "
            f"loop thread {loop:.0%} of a core, other threads {serving:.0%}, "
            f"up to {threads} threads"
        )

    print(show("calm:", period(calm_from, storm_from)))
    print(show("storm:", period(storm_from, storm_to)))
    print(show("after storm:", period(storm_to, after_to)))
    print(
        f"the storm: {args.scrapers} scrapers made {scrapes} scrapes "
        f"({scrapes / (storm_to - storm_from):.0f}/s; {failures} refused or failed) beside "
        f"{half_open} half-open connections"
    )


if __name__ == "__main__":
    main()

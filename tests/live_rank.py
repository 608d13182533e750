"""One training rank for the live tests: the real training API in a tiny loop.

    python tests/live_rank.py JOB NODE RANK STALL_EVERY [GPUS]

JOB, NODE or RANK "-" leaves that field to the environment (e.g. a pod: KUBERNETES_SERVICE_HOST
set, RANK or not). GPUS ("0=GPU-a,1=GPU-b") is the rank's GPU assignment, as CUDA would report.

Prints the port it serves on, then trains until killed: steps of about 20 ms (dataloader,
forward, backward, optimizer); with STALL_EVERY > 0, after 120 steps every STALL_EVERY-th
step stalls for 0.25 s in the dataloader (step outliers).

With TRAINPROF_LIVE_KERNEL_TRACE set to a real GPU Kineto trace, the rank runs with
kernel_profile on (no window ever due) and folds that trace into its kernel series every
5 s, through the aggregation a profiled window uses: there is no GPU here to profile.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time

import trainprof


def main() -> None:
    job, node, rank = (None if a == "-" else a for a in sys.argv[1:4])
    stall_every = int(sys.argv[4])
    gpus = [g.split("=", 1) for g in sys.argv[5].split(",")] if len(sys.argv) > 5 else None
    trace = os.environ.get("TRAINPROF_LIVE_KERNEL_TRACE")
    never = f"first=1000000000,dir={tempfile.mkdtemp(prefix='trainprof-live-')}"
    session = trainprof.start(
        port=0,
        addr="127.0.0.1",
        training_job=job,
        node=node,
        rank=None if rank is None else int(rank),
        local_rank=0,
        world_size=2,
        gpus=gpus,
        kernel_profile=never if trace else None,
    )
    trace = os.environ.get("TRAINPROF_LIVE_KERNEL_TRACE")
    if trace:
        feed_kernel_windows(session, trace)
    print(session.port, flush=True)
    n = 0
    while True:
        n += 1
        stall = stall_every and n > 120 and n % stall_every == 0
        with trainprof.step():
            with trainprof.phase("dataloader"):
                time.sleep(0.25 if stall else 0.004)
            with trainprof.phase("forward"):
                time.sleep(0.006)
            with trainprof.phase("backward"):
                time.sleep(0.008)
            with trainprof.phase("optimizer"):
                time.sleep(0.002)


def feed_kernel_windows(session, path: str) -> None:
    from trainprof.trace import read_trace

    trace = read_trace(path)

    def feed() -> None:
        while True:
            session._kernel.series.add_window(trace, steps=3, overhead=0.0)
            time.sleep(5)

    threading.Thread(target=feed, daemon=True).start()


if __name__ == "__main__":
    main()

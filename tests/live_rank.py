"""One training rank for the live tests: the real training API in a tiny loop.

    python tests/live_rank.py JOB NODE RANK STALL_EVERY [GPUS]

JOB, NODE or RANK "-" leaves that field to the environment (e.g. a pod: KUBERNETES_SERVICE_HOST
set, RANK or not). GPUS ("0=GPU-a,1=GPU-b") is the rank's GPU assignment, as CUDA would report.

Prints the port it serves on, then trains until killed: steps of about 20 ms (dataloader,
forward, backward, optimizer); with STALL_EVERY > 0, after 120 steps every STALL_EVERY-th
step stalls for 0.25 s in the dataloader (step outliers).
"""

from __future__ import annotations

import sys
import time

import trainprof


def main() -> None:
    job, node, rank = (None if a == "-" else a for a in sys.argv[1:4])
    stall_every = int(sys.argv[4])
    gpus = [g.split("=", 1) for g in sys.argv[5].split(",")] if len(sys.argv) > 5 else None
    session = trainprof.start(
        port=0,
        addr="127.0.0.1",
        training_job=job,
        node=node,
        rank=None if rank is None else int(rank),
        local_rank=0,
        world_size=2,
        gpus=gpus,
    )
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


if __name__ == "__main__":
    main()

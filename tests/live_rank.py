"""One training rank for the live tests: the real training API in a tiny loop.

    python tests/live_rank.py JOB NODE RANK STALL_EVERY WORKERS

Prints the port it serves on, then trains until killed: steps of about 20 ms (dataloader,
forward, backward, optimizer); with STALL_EVERY > 0, after 120 steps every STALL_EVERY-th
step stalls for 0.25 s in the dataloader (step outliers). Its data loader says it runs
WORKERS worker processes (the Dataloader rule's input).
"""

from __future__ import annotations

import sys
import time

import trainprof


class _Loader:
    """A DataLoader stand-in: trainprof.data() reads its worker count."""

    def __init__(self, workers: int):
        self.num_workers = workers

    def __iter__(self):
        return iter(())


def main() -> None:
    job, node, rank, stall_every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    session = trainprof.start(
        port=0, addr="127.0.0.1", training_job=job, node=node, rank=rank, local_rank=0, world_size=2
    )
    for _ in trainprof.data(_Loader(int(sys.argv[5]))):
        pass
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

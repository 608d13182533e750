"""The golden scrape of a training rank: the exact bytes its /metrics serves after a scripted
sequence of steps and phases.

The clock is a fake that moves in binary fractions of a second, so every duration, sum and
timestamp is exact whatever order the hot path adds them in: a change to how steps and phases
are timed must serve the same bytes for the same observations. Regenerate with
`pytest tests/test_rank_exposition.py --update-golden` and review the diff.
"""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest

import trainprof
from trainprof.training import process, timing

WALL_CLOCK = 1_700_000_000.0


class Clock:
    """perf_counter, moved by hand; starts where a real one could be."""

    def __init__(self) -> None:
        self.now = 4096.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(timing, "perf_counter", fake)
    monkeypatch.setattr("trainprof.training.session.perf_counter", fake)
    monkeypatch.setattr(time, "time", lambda: WALL_CLOCK)
    monkeypatch.setattr(process, "process_start_time", lambda proc="/proc": WALL_CLOCK - 64.0)
    for var in ("TRAINPROF_BASE_PORT", "TRAINPROF_RULES_CONFIG", "TRAINPROF_KERNEL_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    trainprof.stop()
    yield fake
    trainprof.stop()


def scripted_training(clock: Clock) -> None:
    """Steps of every mode, nested and user phases, the data loader, outliers, decorators,
    an exception from the loop, a frame left out of order, and a second thread."""

    class Loader:
        num_workers = 2

        def __iter__(self):
            for batch in range(130):
                clock.advance(1 / 128)  # the wait for the next batch
                yield batch

    for i, _ in enumerate(trainprof.data(Loader())):
        with trainprof.step(samples=32, tokens=4096 if i % 2 else None):
            clock.advance(1 / 64)  # unattributed: "other"
            with trainprof.phase("forward"):
                clock.advance(0.125 + (i % 5) / 256)
                with trainprof.phase("attention"):  # a user phase, nested
                    clock.advance(1 / 32)
            with trainprof.phase("backward"):
                clock.advance(0.25)
            with trainprof.phase("optimizer"):
                clock.advance(2.0 if i in (110, 120) else 1 / 16)  # outliers after 100 steps
        if i % 40 == 39:
            with trainprof.step(mode="validation"):
                clock.advance(0.5)
                with trainprof.phase("forward"):
                    clock.advance(0.25)

    @trainprof.phase("checkpoint")
    def save() -> None:
        clock.advance(1.5)

    @trainprof.step(mode="predict", samples=8)
    def predict() -> None:
        clock.advance(0.75)

    save()
    predict()
    with pytest.raises(RuntimeError):
        with trainprof.step():
            with trainprof.phase("forward"):
                clock.advance(0.5)
                raise RuntimeError("CUDA out of memory")
    outer, inner = trainprof.phase("forward"), trainprof.phase("backward")
    outer.__enter__()
    inner.__enter__()
    clock.advance(1.0)
    outer.__exit__(None, None, None)
    inner.__exit__(None, None, None)

    def other_thread() -> None:
        for _ in range(3):
            with trainprof.step(mode="global"):
                clock.advance(0.5)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    trainprof.add(samples=5, tokens=7)


def test_a_scrape_of_a_scripted_rank_matches_the_golden_file(clock, root, update_golden):
    session = trainprof.start(
        port=0,
        addr="127.0.0.1",
        training_job="golden",
        node="n1",
        rank=3,
        local_rank=1,
        world_size=8,
        stddevs=[2.5],
        gpus=[(1, "GPU-00000000-0000-0000-0000-000000000001")],
        framework="pytorch",
        framework_version="2.13.0",
    )
    scripted_training(clock)
    with urllib.request.urlopen(f"http://127.0.0.1:{session.port}/metrics", timeout=10) as r:
        body = r.read()
    path = root / "tests" / "golden" / "rank.prom"
    if update_golden:
        path.write_bytes(body)
    assert path.exists(), f"{path} is missing; generate and review it with --update-golden"
    assert body.decode() == path.read_text(), (
        f"scrape differs from {path}; if intended, rerun with --update-golden and review the diff"
    )

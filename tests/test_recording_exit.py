"""A training process that records (`start(record=...)`) and ends any way but `stop()`: it
returns, calls sys.exit, crashes, gets SIGTERM, or is killed with SIGKILL. Its recording must
be complete (or, after SIGKILL, complete up to the last flush), and keep the job name and
the phases."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from trainprof.contract import recording

STEPS = 300

TRAINER = textwrap.dedent(
    """
    import os, signal, sys, time
    import trainprof

    path, ending = sys.argv[1], sys.argv[2]
    trainprof.start(serve=False, record=path, training_job="exit-job")
    for _ in range({steps}):
        with trainprof.step():
            with trainprof.phase("forward"):
                time.sleep(0.0002)
    if ending == "sys.exit":
        sys.exit(3)
    if ending == "crash":
        raise RuntimeError("the training loop crashed")
    if ending == "SIGTERM":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    if ending == "SIGKILL":
        time.sleep(2.5)  # more than one flush interval (1 s) after the last step
        os.kill(os.getpid(), signal.SIGKILL)
    """
).format(steps=STEPS)


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl"])
@pytest.mark.parametrize(
    "ending, returncode",
    [
        ("return", 0),
        ("sys.exit", 3),
        ("crash", 1),
        ("SIGTERM", -signal.SIGTERM),
        ("SIGKILL", -signal.SIGKILL),
    ],
)
def test_a_recording_survives_every_way_a_trainer_ends(tmp_path, suffix, ending, returncode):
    path = tmp_path / f"run{suffix}"
    done = subprocess.run(
        [sys.executable, "-c", TRAINER, str(path), ending],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == returncode, done.stderr
    records = [r for _, r in recording.read(str(path))]  # raises on a truncated file
    kinds = [r["kind"] for r in records]
    assert kinds.count("step") == STEPS
    [process] = [r for r in records if r["kind"] == "process"]
    assert process["training_job"] == "exit-job"
    phases = [r for r in records if r["kind"] == "phases"]
    assert phases and phases[-1]["seconds"]["forward"] > 0

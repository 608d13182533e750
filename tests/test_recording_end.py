"""When training ended, from the rank's own recording: `trainprof.start(record=...)` closes its
file with an end record, and replay ends the rank's series there (stale, as Prometheus marks
a gone target's series), however long the host's recording (`trainprof exporter --record`)
goes on. Real recordings: a real exporter process and a real training process."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

from trainprof.contract import recording
from trainprof.replay import load_timeline, replay

RANK = textwrap.dedent(
    """
    import sys, time
    import trainprof

    path, stall = sys.argv[1], float(sys.argv[2])
    trainprof.start(serve=False, record=path, training_job="end-job", node="n1", rank=0,
                    world_size=1)

    def train(seconds):
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            with trainprof.step():
                time.sleep(0.02)

    train(3)
    time.sleep(stall)  # stalled: the process is alive, no step ends
    train(2)
    # no trainprof.stop(): the recording is closed (with its end record) at exit
    """
)
THRESHOLD = 5.0
RULES = {
    "scrape_interval": "1s",
    "rules": [
        {
            "rule": "StalledTrainingRule",
            "parameters": {"threshold": THRESHOLD, "scan_interval_us": 1_000_000},
        }
    ],
}


def record_job(folder, stall: float, after: float):
    """A real exporter recording the host while a real rank trains (stalling `stall`
    seconds), and `after` seconds more once the rank has exited. Both recordings go to a
    folder that does not exist yet."""
    host = folder / "host.jsonl.gz"
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainprof.cli",
            "exporter",
            "--no-collector.gpu",
            "--web.listen-address",
            "127.0.0.1:0",
            "--record",
            str(host),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not host.exists():
            assert time.monotonic() < deadline and exporter.poll() is None, exporter.stderr.read()
            time.sleep(0.2)
        rank = subprocess.run(
            [sys.executable, "-c", RANK, str(folder / "steps.jsonl.gz"), str(stall)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert rank.returncode == 0, rank.stderr
        time.sleep(after)
    finally:
        exporter.send_signal(signal.SIGTERM)
        exporter.communicate(timeout=30)
    assert exporter.returncode == 0


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rules") / "stalled.yaml"
    path.write_text(yaml.safe_dump(RULES))
    return str(path)


# Both record a real exporter and a real rank in real time, past the stall threshold.
REAL_TIME = pytest.mark.slow(reason="15 s of a real exporter and rank recording in real time")


@REAL_TIME
def test_a_rank_that_ended_is_not_stalled_however_long_the_host_records(
    tmp_path, rules_file, promtool
):
    folder = tmp_path / "runs" / "today"
    record_job(folder, stall=0.0, after=2 * THRESHOLD)
    kinds = [r["kind"] for _, r in recording.read(str(folder / "steps.jsonl.gz"))]
    assert kinds[-1] == "end" and kinds.count("end") == 1
    timeline, _ = load_timeline(str(folder), "auto", None)
    ended = timeline.rank_ends[("n1", 0)]
    host_end = timeline.hosts[next(iter(timeline.hosts))][-1].timestamp
    assert host_end - ended > THRESHOLD + 2  # the host recorded on well past the threshold
    result = replay(str(folder), rules_file, scrape_interval=1.0)
    stalled = result.rules["StalledTrainingRule"]
    assert not stalled.fired, stalled.alerts
    assert stalled.status.status == "quiet"


@REAL_TIME
def test_a_rank_that_stalled_while_alive_still_fires(tmp_path, rules_file, promtool):
    folder = tmp_path / "runs" / "stalled"
    record_job(folder, stall=THRESHOLD + 4, after=1.0)
    steps = sorted(
        r["end"] for _, r in recording.read(str(folder / "steps.jsonl.gz")) if r["kind"] == "step"
    )
    gap_start = next(a for a, b in zip(steps, steps[1:]) if b - a > THRESHOLD)
    result = replay(str(folder), rules_file, scrape_interval=1.0)
    stalled = result.rules["StalledTrainingRule"]
    assert stalled.fired
    # a scrape and an evaluation after the threshold passed, at most
    assert gap_start + THRESHOLD <= stalled.first_fired_at <= gap_start + THRESHOLD + 3

"""The sampling thread (on a fake clock: no timed assertions) and the recording it writes."""

from __future__ import annotations

import errno
import logging
import threading

import pytest

from trainprof.contract import recording
from trainprof.contract.sampling import HostSample, SampleAccumulator
from trainprof.exporter.collector import SourceRunner
from trainprof.exporter.recorder import Recorder
from trainprof.exporter.sampler import Sampler

from fakes import ScriptedCpu

INTERVAL = 0.01


class FakeClock:
    def __init__(self):
        self.now = 100.0
        self.lock = threading.Lock()

    def __call__(self):
        with self.lock:
            return self.now

    def advance(self, seconds):
        with self.lock:
            self.now += seconds


class Timed:
    """A source that notes the (fake) time of each read and can take `cost` seconds."""

    name = "timed"

    def __init__(self, clock, cost=0.0):
        self.clock, self.cost = clock, cost
        self.starts: list[float] = []
        self.closed = False
        self.enough = threading.Event()

    def read(self, sample):
        self.starts.append(self.clock())
        self.clock.advance(self.cost)
        if len(self.starts) >= 8:
            self.enough.set()
        return True

    def close(self):
        self.closed = True


def run(source, clock, **kwargs) -> Sampler:
    sampler = Sampler(
        SourceRunner([source]),
        SampleAccumulator(INTERVAL),
        clock=clock,
        sleep=clock.advance,
        **kwargs,
    )
    sampler.start()
    assert source.enough.wait(30), "the sampler stopped sampling"
    sampler.stop()
    return sampler


def test_the_first_read_primes_the_sources_and_is_not_a_datapoint():
    clock = FakeClock()
    source = Timed(clock)
    sampler = run(source, clock)
    assert sampler.samples == len(source.starts) - 1
    assert source.closed


def test_a_slow_sample_skips_ticks_instead_of_sampling_in_a_burst(caplog):
    clock = FakeClock()
    source = Timed(clock, cost=2.5 * INTERVAL)
    with caplog.at_level(logging.INFO, "trainprof.exporter"):
        run(source, clock)
    starts = source.starts[1:]  # after the priming read
    steps = [round((b - a) / INTERVAL, 6) for a, b in zip(starts, starts[1:])]
    assert steps and all(step == 3 for step in steps), steps  # on the grid, never early
    overruns = [r for r in caplog.records if "took longer than" in r.getMessage()]
    assert len(overruns) == 1 and "skipped 2 tick(s)" in overruns[0].getMessage()


def test_a_failing_sample_does_not_stop_the_thread(caplog):
    clock = FakeClock()
    source = Timed(clock)

    def broken(sample):
        raise RuntimeError("disk full somewhere")

    with caplog.at_level(logging.INFO, "trainprof.exporter"):
        run(source, clock, on_sample=broken)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["a sample failed: RuntimeError: disk full somewhere"]


def test_samples_are_recorded_and_the_file_is_complete_after_close(tmp_path):
    path = str(tmp_path / "run.jsonl.gz")
    recorder = Recorder(path, 0.5, "n1")
    runner = SourceRunner([ScriptedCpu([([0.9, 0.1], [0.0, 0.3])])])
    for t in (1.0, 1.5):
        sample = runner.sample()
        sample.timestamp = t
        recorder(sample)
    recorder.close()
    records = [r for _, r in recording.read(path)]
    assert records[0] == recording.meta(0.5, records[0]["writer"])
    assert [recording.host_sample(r).timestamp for r in records[1:]] == [1.0, 1.5]
    assert recording.host_sample(records[1]).cpu_iowait == [0.0, 0.3]


def test_a_recording_that_cannot_be_written_stops_once_and_the_rest_goes_on(
    tmp_path, caplog, monkeypatch
):
    recorder = Recorder(str(tmp_path / "run.jsonl"), 0.5, "n1")

    def full(record):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(recorder._stream, "write", full)
    with caplog.at_level(logging.INFO, "trainprof.exporter"):
        for _ in range(3):
            recorder(HostSample(1.0))
        recorder.close()
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot write the recording {tmp_path / 'run.jsonl'} ([Errno 28] No space left on "
        "device); recording stopped after 0 samples, the exporter keeps serving"
    ]


def test_a_recording_path_that_cannot_be_opened_raises(tmp_path):
    (tmp_path / "a-file").write_text("")  # a missing folder is made; a file in the way is not
    with pytest.raises(OSError):
        Recorder(str(tmp_path / "a-file" / "run.jsonl"), 0.5, "n1")

"""trainprof's recording format round-trips host samples and reports bad lines."""

from __future__ import annotations

import pytest

from trainprof.contract import recording
from trainprof.contract.sampling import GpuSample, HostSample, SampleAccumulator, samples_of


def _sample(t):
    return HostSample(
        t,
        cpu_utilization=[0.5, 0.9],
        cpu_iowait=[0.0, 0.2],
        memory_used_ratio=0.4,
        gpus=[
            GpuSample(0, "GPU-a", utilization=0.3, memory_used_ratio=0.6, power_watts=200.0),
            GpuSample(1, "GPU-b", utilization=None),
        ],
    )


@pytest.mark.parametrize("name", ["rec.jsonl", "rec.jsonl.gz"])
def test_samples_round_trip_to_the_same_series(tmp_path, name):
    path = str(tmp_path / name)
    with recording.open_recording(path, "w") as stream:
        writer = recording.Writer(stream)
        writer.write(recording.meta(0.5, "test"))
        for k in range(1, 5):
            writer.write(recording.host_record("n1", _sample(k * 0.5)))
    direct, replayed = SampleAccumulator(0.5), SampleAccumulator(0.5)
    for k in range(1, 5):
        direct.observe(_sample(k * 0.5))
    records = [r for _, r in recording.read(path)]
    assert records[0]["kind"] == "meta"
    for r in records[1:]:
        replayed.observe(recording.host_sample(r))
    assert list(samples_of(direct.families())) == list(samples_of(replayed.families()))


def test_a_malformed_line_is_reported_with_path_and_line(tmp_path):
    path = tmp_path / "rec.jsonl"
    path.write_text('{"kind": "meta"}\n\n{"kind": "host", "t": 1\n')
    with pytest.raises(recording.RecordingError, match=r"rec.jsonl:3: not JSON"):
        list(recording.read(str(path)))


def test_a_missing_file_is_a_recording_error(tmp_path):
    with pytest.raises(recording.RecordingError, match="cannot read"):
        list(recording.read(str(tmp_path / "nope.jsonl")))

"""Damaged, strange and misplaced replay input: skipped or corrected and said, never a
traceback, never the whole job refused, never work unbounded by the data."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time

import pytest

from trainprof.contract import recording
from trainprof.contract.sampling import GpuSample, HostSample
from trainprof.replay import ReplayError, replay
from trainprof.replay.synthetic import write_system

START = 1_700_000_000
STARVED = {
    "algo-1": {
        "cores": 2,
        "gpus": 1,
        "timeline": [{"gpu_util": 0.03, "cpu": [0.97, 0.97]}],
    }
}


def sagemaker_job(tmp_path, minutes=12):
    out = tmp_path / "job" / "profiler-output"
    write_system(str(out), start=START, duration=minutes * 60, interval=0.5, hosts=STARVED)
    return tmp_path / "job"


def system_files(root):
    return sorted(root.rglob("*.algo-1.json"))


def cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "replay", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_damaged_line_is_skipped_with_file_and_line_and_the_rest_replayed(tmp_path, promtool):
    root = sagemaker_job(tmp_path)
    first = system_files(root)[0]
    lines = first.read_text().splitlines(keepends=True)
    lines[4] = '{"Type":"gpu","Name":"gpu0",\n'  # cut in half
    lines[7] = '{"Type":"gpu","Name":"gpu0","Dimension":"GPUUtilization"}\n'  # no value
    first.write_text("".join(lines))
    result = replay(str(root), None, scrape_interval=15)
    assert result.rules["LowGPUUtilization"].fired
    assert any(f"{first}:5" in n and "not JSON" in n for n in result.notes), result.notes
    assert any(f"{first}:8" in n and "without Name, Value and Timestamp" in n for n in result.notes)
    assert result.samples >= 12 * 120 - 1


def test_a_binary_or_unreadable_file_is_skipped_and_named(tmp_path, promtool):
    root = sagemaker_job(tmp_path)
    files = system_files(root)
    files[1].write_bytes(b"\x00\xff\xfe garbage \x80\x81" * 50)
    files[2].chmod(0)
    result = replay(str(root), None, scrape_interval=15)
    assert result.rules["LowGPUUtilization"].fired
    notes = "\n".join(result.notes)
    assert str(files[1]) in notes and "not text" in notes
    import os

    if os.geteuid() != 0:  # root reads any file
        assert str(files[2]) in notes and "unreadable" in notes


def test_out_of_range_timestamps_are_dropped_and_do_not_stretch_the_replay(tmp_path, promtool):
    root = sagemaker_job(tmp_path, minutes=12)
    first = system_files(root)[0]
    with open(first, "a") as f:
        for ts in (0, -1e9, 1e12, "NaN", "Infinity"):
            f.write(
                '{"Type":"cpu","Name":"cpu0","Dimension":"CPUUtilization","Value":50,'
                f'"NodeId":"algo-1","Timestamp":{ts}}}\n'
            )
    # A whole minute file from a year later, in the same folder.
    year = 365 * 86400
    later = first.parent / f"{START + year}.algo-1.json"
    with open(later, "w") as f:
        for line in system_files(root)[1].read_text().splitlines():
            event = json.loads(line)
            f.write(json.dumps({**event, "Timestamp": event["Timestamp"] + year}) + "\n")
    began = time.monotonic()
    result = replay(str(root), None, scrape_interval=15)
    assert time.monotonic() - began < 60
    assert result.end - result.start < 20 * 60  # the job's 12 minutes, not a year
    assert result.rules["LowGPUUtilization"].fired
    notes = "\n".join(result.notes)
    assert "timestamp outside 2000..2100" in notes and f"{first}:" in notes
    assert "6 h away from the job" in notes


def test_nan_infinite_negative_and_above_100_values_are_skipped_or_clamped(tmp_path, promtool):
    root = sagemaker_job(tmp_path)
    first = system_files(root)[0]
    with open(first, "a") as f:
        for value in ("NaN", "Infinity", "-Infinity", -30, 250):
            f.write(
                '{"Type":"gpu","Name":"gpu0","Dimension":"GPUUtilization",'
                f'"Value":{value},"NodeId":"algo-1","Timestamp":{START + 30.25}}}\n'
            )
    result = cli(root, "--scrape-interval", "15s", "--json", "-")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "skipped 3 line(s) values that is not a number" in result.stderr
    assert "corrected 2 line(s) values outside 0..100% (clamped)" in result.stderr
    assert json.loads(result.stdout)["rules"]["LowGPUUtilization"]["fired"]


def test_duplicated_files_are_replayed_once_and_reported(tmp_path, promtool):
    root = sagemaker_job(tmp_path, minutes=3)
    first = system_files(root)[0]
    copy = first.parent / f"{int(first.name.split('.')[0]) + 3600}.algo-1.json"
    copy.write_bytes(first.read_bytes())
    result = replay(str(root), None, scrape_interval=15)
    assert any("identical to another" in n and str(copy) in n for n in result.notes)
    assert result.samples == 3 * 120


def _write_recording(path, seconds, start=START, node="algo-1"):
    with recording.open_recording(str(path), "w") as stream:
        writer = recording.Writer(stream)
        writer.write(recording.meta(0.5, "test"))
        for k in range(1, int(seconds * 2) + 1):
            sample = HostSample(
                start + k * 0.5,
                cpu_utilization=[0.97, 0.97],
                cpu_iowait=[0, 0],
                memory_used_ratio=0.3,
                gpus=[GpuSample(0, "gpu0", utilization=0.03, memory_used_ratio=0.5)],
            )
            writer.write(recording.host_record(node, sample))


def test_a_truncated_gzip_recording_is_read_up_to_the_damage(tmp_path, promtool):
    folder = tmp_path / "rec"
    folder.mkdir()
    _write_recording(folder / "host.jsonl.gz", 12 * 60)
    _write_recording(folder / "trainer.jsonl.gz", 12 * 60, node="algo-2")
    whole = (folder / "trainer.jsonl.gz").read_bytes()
    (folder / "trainer.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    result = replay(str(folder), None, scrape_interval=15)
    assert result.nodes == 2  # the intact recording and what the damaged one held
    assert {u.labels["node"] for u in result.rules["LowGPUUtilization"].affected} == {
        "algo-1",
        "algo-2",
    }
    read = [n for n in result.notes if "trainer.jsonl.gz" in n and "ends early" in n]
    assert read and read[0].startswith("read ")
    lines_read = int(read[0].split()[1])
    with gzip.open(folder / "host.jsonl.gz", "rt") as f:
        total = sum(1 for _ in f)
    assert 0 < lines_read < total


def test_a_corrupt_line_inside_a_plain_recording_is_skipped(tmp_path, promtool):
    path = tmp_path / "rec.jsonl"
    _write_recording(path, 12 * 60)
    lines = path.read_text().splitlines(keepends=True)
    lines[10] = "\x00\x01garbled\n"
    lines[11] = '{"kind":"host","node":"algo-1","t":"soon"}\n'
    lines[12] = '{"kind":"host","node":"algo-1","t":NaN}\n'
    lines[-1] = lines[-1][:20]  # the last line cut by a kill
    path.write_text("".join(lines))
    result = replay(str(path), None, scrape_interval=15)
    assert result.rules["LowGPUUtilization"].fired
    notes = "\n".join(result.notes)
    assert f"{path}:11" in notes and f"{path}:12" in notes and f"{path}:{len(lines)}" in notes


def test_duplicated_recording_files_are_counted_once(tmp_path, promtool):
    folder = tmp_path / "rec"
    folder.mkdir()
    _write_recording(folder / "a.jsonl", 3 * 60)
    (folder / "copy.jsonl").write_bytes((folder / "a.jsonl").read_bytes())
    result = replay(str(folder), None, scrape_interval=15)
    assert result.samples == 3 * 120
    assert any("duplicated record" in n for n in result.notes)


def test_a_scrape_interval_finer_than_the_samples_is_refused_quickly(tmp_path):
    root = sagemaker_job(tmp_path, minutes=12)
    began = time.monotonic()
    result = cli(root, "--scrape-interval", "1ms", timeout=60)
    assert time.monotonic() - began < 30
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "shorter than the samples" in result.stderr and "0.5s or more" in result.stderr


def test_replay_of_a_folder_says_where_it_found_the_job_however_deep(tmp_path, promtool):
    deep = tmp_path / "a" / "b" / "c" / "d" / "e" / "f" / "g"
    sagemaker_job(deep, minutes=3)
    result = cli(tmp_path, "--scrape-interval", "15s")
    assert result.returncode == 0, result.stderr
    assert f"found SageMaker profiler output at {deep / 'job' / 'profiler-output'}" in (
        result.stdout + result.stderr
    )


def test_nothing_readable_at_all_is_still_an_error_naming_the_damage(tmp_path):
    root = sagemaker_job(tmp_path, minutes=1)
    for f in system_files(root):
        f.write_text("not json\n")
    with pytest.raises(ReplayError, match="no system metrics.*not JSON"):
        replay(str(root), None)

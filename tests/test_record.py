"""Recording a job for replay: the exporter's host samples (`trainprof record`) and the
training ranks' steps (`trainprof.start(record=...)`), replayed together."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

import trainprof
from trainprof.contract import recording
from trainprof.contract.sampling import GpuSample, HostSample
from trainprof.replay import replay
from trainprof.training.step_recorder import rank_path


@pytest.fixture(autouse=True)
def fresh_session():
    trainprof.stop()
    yield
    trainprof.stop()


def test_one_file_per_rank():
    assert rank_path("run.jsonl.gz", 3, 8) == "run.rank3.jsonl.gz"
    assert rank_path("run.jsonl", 0, 1) == "run.jsonl"
    assert rank_path("out/{rank}/steps.jsonl", 5, 8) == "out/5/steps.jsonl"


def test_recorded_steps_and_host_samples_replay_together(tmp_path, promtool):
    trainprof.start(
        port=0,
        addr="127.0.0.1",
        training_job="rec",
        node="n1",
        rank=0,
        world_size=1,
        record=str(tmp_path / "steps.jsonl.gz"),
    )
    for n in range(160):
        with trainprof.step():
            time.sleep(0.06 if n >= 110 and n % 3 == 0 else 0.002)
    trainprof.stop()
    records = [r for _, r in recording.read(str(tmp_path / "steps.jsonl.gz"))]
    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == 160 and records[1]["kind"] == "process"

    end = steps[-1]["end"]
    with recording.open_recording(str(tmp_path / "host.jsonl"), "w") as stream:
        writer = recording.Writer(stream)
        writer.write(recording.meta(0.5, "test"))
        for k in range(int((end + 60 - steps[0]["start"]) / 0.5)):
            writer.write(
                recording.host_record(
                    "n1",
                    HostSample(
                        steps[0]["start"] + k * 0.5,
                        cpu_utilization=[0.5],
                        cpu_iowait=[0.0],
                        gpus=[GpuSample(0, "GPU-0", utilization=0.9, memory_used_ratio=0.5)],
                    ),
                )
            )
    # The rank lived about two seconds and its recording says when it ended: replay serves
    # its series only while it lived, as Prometheus scraped it, so the rules are evaluated
    # every second, or no evaluation would see the rank at all.
    rules = tmp_path / "fast-rules.yaml"  # replay reads only the .jsonl files here
    rules.write_text(
        "scrape_interval: 1s\nrules:\n- rule: ProfilerReport\n"
        "  parameters: {scan_interval_us: 1000000}\n"
    )
    result = replay(str(tmp_path), str(rules), scrape_interval=1, training_job="rec")
    assert result.steps == 160
    outlier = result.rules["StepOutlier"]
    assert outlier.fired and [u.labels["rank"] for u in outlier.affected] == ["0"]
    assert not result.rules["MaxInitializationTime"].fired


def test_an_unwritable_recording_is_one_warning_and_training_goes_on(tmp_path, caplog):
    (tmp_path / "a-file").write_text("")  # in the way of the folder: it cannot be created
    session = trainprof.start(
        port=0, addr="127.0.0.1", record=str(tmp_path / "a-file" / "runs" / "x.jsonl")
    )
    with trainprof.step():
        pass
    assert session.recorder is None and session.started
    assert any("cannot record" in r.getMessage() for r in caplog.records)


def test_the_recording_s_folder_is_created(tmp_path, caplog):
    path = tmp_path / "runs" / "today" / "x.jsonl.gz"
    session = trainprof.start(port=0, addr="127.0.0.1", record=str(path))
    for _ in range(3):
        with trainprof.step():
            pass
    assert session.recorder is not None
    trainprof.stop()
    assert not any("cannot record" in r.getMessage() for r in caplog.records)
    kinds = [r["kind"] for _, r in recording.read(str(path))]
    assert kinds.count("step") == 3


def test_trainprof_record_writes_the_hosts_samples_until_stopped(tmp_path):
    out = tmp_path / "runs" / "host.jsonl.gz"  # its folder does not exist yet
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainprof.cli",
            "record",
            str(out),
            "--web.listen-address",
            "127.0.0.1:0",
            "--no-collector.gpu",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not out.exists() or out.stat().st_size < 200:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.5)
        time.sleep(1.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    assert proc.returncode == 0
    kinds = [r["kind"] for _, r in recording.read(str(out))]
    assert kinds[0] == "meta" and kinds.count("host") >= 2

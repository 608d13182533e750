"""`trainprof replay` over SageMaker-layout timelines and trainprof recordings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from replay_contract import UNIT_KEYS, VERDICT_KEYS
from trainprof.contract import recording
from trainprof.contract.sampling import GpuSample, HostSample
from trainprof.replay import ReplayError, replay
from trainprof.replay.synthetic import write_steps, write_system

START = 1_700_000_000  # 2023-11-14 22:13:20 UTC: t0 is the minute before, 22:13:00
T0 = START - 20


def job(tmp_path, hosts, minutes=16, interval=0.5):
    out = tmp_path / "job" / "profiler-output"
    write_system(str(out), start=START, duration=minutes * 60, interval=interval, hosts=hosts)
    return str(tmp_path / "job")


IDLE_GPU_BUSY_CORE = {
    "algo-1": {
        "cores": 4,
        "gpus": 2,
        "timeline": [{"gpu_util": [0.03, 0.9], "cpu": [0.97, 0.3, 0.3, 0.3]}],
    }
}
HEALTHY = {"algo-1": {"cores": 4, "gpus": 2, "timeline": [{"gpu_util": 0.9, "cpu": 0.5}]}}


@pytest.mark.parametrize("scrape", [1.0, 15.0])
def test_a_starved_gpu_fires_the_same_rules_at_1s_and_15s(tmp_path, scrape, promtool):
    result = replay(job(tmp_path, IDLE_GPU_BUSY_CORE), None, scrape_interval=scrape)
    fired = {name for name, v in result.rules.items() if v.fired}
    assert fired == {"CPUBottleneck", "LowGPUUtilization", "LoadBalancing", "BatchSize"}
    low = result.rules["LowGPUUtilization"]
    # one alert for the job, the GPU it found beside it
    assert [a.labels["reason"] for a in low.alerts] == ["underutilized"]
    assert "gpu" not in low.alerts[0].labels
    assert [(u.labels["gpu"], u.labels["reason"]) for u in low.affected] == [("0", "underutilized")]
    assert low.affected[0].worst == 1.0  # every sample at or below 70%
    # found at t0+1m (pending), `for: 8m20s`, evaluated every minute: fires at t0 + 10m.
    assert low.affected[0].first_at == T0 + 60
    assert low.first_fired_at == T0 + 600
    assert result.rules["CPUBottleneck"].alerts[0].labels["training_job"] == "job"


@pytest.mark.parametrize("scrape", [1.0, 15.0])
def test_a_healthy_job_fires_nothing(tmp_path, scrape, promtool):
    result = replay(job(tmp_path, HEALTHY), None, scrape_interval=scrape)
    assert not any(v.fired for v in result.rules.values())


def test_overrides_in_a_profiler_report_configuration_change_the_verdict(tmp_path, promtool):
    config = tmp_path / "rules.yaml"
    config.write_text(
        "rules:\n- rule: ProfilerReport\n  parameters:\n"
        "    LowGPUUtilization_threshold_p95: 2\n"
        "    LowGPUUtilization_threshold_p5: 1\n"
        "    CPUBottleneck_cpu_threshold: 98\n"
        "    LoadBalancing_threshold: 0.9\n"
        "    BatchSize_gpu_memory_threshold_p95: 40\n"
    )
    result = replay(job(tmp_path, IDLE_GPU_BUSY_CORE), str(config), scrape_interval=15)
    assert not any(v.fired for v in result.rules.values())


def test_two_nodes_pool_cpu_bottlenecks_and_report_gpus_per_node(tmp_path, promtool):
    hosts = {
        "algo-1": {"cores": 2, "gpus": 1, "timeline": [{"gpu_util": 0.02, "cpu": 0.97}]},
        "algo-2": {"cores": 2, "gpus": 1, "timeline": [{"gpu_util": 0.02, "cpu": 0.97}]},
    }
    result = replay(job(tmp_path, hosts), None, scrape_interval=15)
    assert result.nodes == 2 and result.gpus == 2
    assert len(result.rules["CPUBottleneck"].alerts) == 1
    low = result.rules["LowGPUUtilization"]
    assert len(low.alerts) == 1  # one for the job, its GPUs listed beside it
    assert sorted(u.labels["node"] for u in low.affected) == ["algo-1", "algo-2"]


def test_json_output_is_exactly_the_contract(tmp_path, promtool):
    source = job(tmp_path, IDLE_GPU_BUSY_CORE)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainprof.cli",
            "replay",
            source,
            "--scrape-interval",
            "15s",
            "--json",
            "-",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert list(doc) == ["rules"]
    for verdict in doc["rules"].values():
        assert set(verdict) == VERDICT_KEYS
        assert verdict["status"] in ("fired", "quiet", "no_data", "not_applicable")
        assert verdict["fired"] == (verdict["status"] == "fired")
        for alert in verdict["alerts"]:
            assert set(alert) == {"labels", "fired_at"}
            assert isinstance(alert["fired_at"], (int, float))
        for unit in verdict["affected"]:
            assert set(unit) == UNIT_KEYS
            assert unit["first_at"] <= unit["last_at"]
        assert bool(verdict["alerts"]) <= bool(verdict["affected"])  # fired: units found
    assert doc["rules"]["LowGPUUtilization"]["first_fired_at"] == T0 + 600
    # the GPU it found: GPU 0, every sample at or below 70% from t0+1m to the end
    (unit,) = doc["rules"]["LowGPUUtilization"]["affected"]
    assert unit["labels"]["gpu"] == "0" and unit["labels"]["reason"] == "underutilized"
    assert (unit["first_at"], unit["worst"]) == (T0 + 60, 1)
    io = doc["rules"]["IOBottleneck"]
    assert (io["fired"], io["status"], io["alerts"]) == (False, "quiet", [])
    assert io["measured"]["threshold"] == 0.5 and io["measured"]["value"] < 0.5
    assert 0.95 * 16 * 120 <= io["datapoints"] <= 16 * 120
    # No steps were recorded, and the job has two GPUs on its node.
    assert doc["rules"]["StepOutlier"]["status"] == "no_data"
    assert doc["rules"]["LoadBalancing"]["status"] == "fired"


def test_a_trainprof_recording_replays_like_the_same_samples_in_sagemaker_layout(
    tmp_path, promtool
):
    path = tmp_path / "rec.jsonl.gz"
    with recording.open_recording(str(path), "w") as stream:
        writer = recording.Writer(stream)
        writer.write(recording.meta(0.5, "test"))
        for k in range(1, 16 * 120 + 1):
            sample = HostSample(
                START + k * 0.5,
                cpu_utilization=[0.97, 0.3, 0.3, 0.3],
                cpu_iowait=[0, 0, 0, 0],
                memory_used_ratio=0.3,
                gpus=[
                    GpuSample(0, "gpu0", utilization=0.03, memory_used_ratio=0.5),
                    GpuSample(1, "gpu1", utilization=0.9, memory_used_ratio=0.5),
                ],
            )
            writer.write(recording.host_record("algo-1", sample))
    recorded = replay(str(path), None, scrape_interval=15, training_job="job")
    sagemaker = replay(job(tmp_path, IDLE_GPU_BUSY_CORE), None, scrape_interval=15)
    assert recorded.as_json() == sagemaker.as_json()


def test_real_sagemaker_output_replays(real_data, promtool):
    source = str(real_data / "real-sagemaker" / "trimcrae-8xtt-redock")
    result = replay(source, None, scrape_interval=15)
    assert result.datapoint_interval == 0.5 and result.samples > 1400
    assert result.rules["LowGPUUtilization"].fired  # the GPU idled for most of the job
    assert any("Algorithm" not in n for n in result.notes)


def test_real_sagemaker_output_says_what_was_and_was_not_decided(real_data, promtool):
    source = real_data / "real-sagemaker" / "trimcrae-8xtt-redock"
    statuses = {n: v.status for n, v in replay(str(source), None, scrape_interval=15).rules.items()}
    assert statuses["LoadBalancing"].status == "not_applicable"  # one GPU
    assert statuses["StepOutlier"].status == "no_data"  # no framework traces
    assert statuses["MaxInitializationTime"].status == "no_data"
    cpu = statuses["CPUBottleneck"]
    # SageMaker's own report of this job: CPUBottleneck 47 % against its 50 % threshold.
    assert cpu.status == "quiet" and cpu.measure.threshold == 0.5
    assert 0.44 <= cpu.measure.value < 0.5
    assert cpu.datapoints > 1400


def test_missing_source_and_empty_source_are_errors(tmp_path):
    with pytest.raises(ReplayError, match="no such file"):
        replay(str(tmp_path / "nope"), None)
    (tmp_path / "empty" / "system" / "incremental").mkdir(parents=True)
    with pytest.raises(ReplayError, match="no system metrics"):
        replay(str(tmp_path / "empty"), None)


def test_a_malformed_line_is_skipped_and_reported_with_its_path_and_line(tmp_path, promtool):
    source = job(tmp_path, HEALTHY, minutes=2)
    files = sorted((tmp_path / "job").rglob("*.algo-1.json"))
    lines = files[0].read_text().splitlines(keepends=True)
    lines[4] = '{"Type":"gpu","Name":"gpu0",\n'
    files[0].write_text("".join(lines))
    result = replay(source, None)
    assert any(f"{files[0]}:5" in n and "not JSON" in n for n in result.notes), result.notes


def test_unknown_dimensions_are_counted_and_ignored(tmp_path, promtool):
    source = job(tmp_path, HEALTHY, minutes=3)
    first = sorted((tmp_path / "job").rglob("*.algo-1.json"))[0]
    with open(first, "a") as f:
        f.write(
            '{"Type":"gpu","Name":"gpu0","Dimension":"GPUTemperature","Value":60,'
            '"NodeId":"algo-1","Timestamp":%f}\n' % (START + 1)
        )
    result = replay(source, None, scrape_interval=15)
    assert any("GPUTemperature (1 lines)" in n for n in result.notes)


def test_cli_reports_bad_sources_with_exit_2_and_no_traceback(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "replay", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "neither SageMaker profiler output" in out.stderr


def _steps(start, count, duration, slow=(), slow_duration=2.0, mode="train"):
    """`count` back-to-back steps from `start`; those numbered in `slow` take longer."""
    out, t = [], start
    for n in range(count):
        d = slow_duration if n in slow else duration + 0.001 * (n % 7)
        out.append((mode, t, t + d))
        t += d
    return out


@pytest.mark.parametrize("scrape", [1.0, 15.0])
def test_step_outliers_from_framework_traces_fire_per_rank(tmp_path, scrape, promtool):
    source = job(tmp_path, HEALTHY, minutes=12)
    out = str(tmp_path / "job" / "profiler-output")
    write_steps(out, "algo-1", 0, _steps(START + 60, 400, 0.5, slow=range(150, 400, 20)))
    write_steps(out, "algo-1", 1, _steps(START + 60, 400, 0.5, slow=range(150, 400, 40)))
    result = replay(source, None, scrape_interval=scrape)
    verdict = result.rules["StepOutlier"]
    assert len(verdict.alerts) == 1
    # 13 outliers on rank 0 (> 10 fires), 7 on rank 1 (quiet).
    found = [(u.labels["rank"], u.labels["mode"], u.labels["stddev"]) for u in verdict.affected]
    assert found == [("0", "train", "3")]
    assert result.steps == 800
    assert not result.rules["MaxInitializationTime"].fired


@pytest.mark.parametrize("scrape", [1.0, 15.0])
def test_a_job_whose_first_step_comes_late_fires_max_initialization_time(
    tmp_path, scrape, promtool
):
    source = job(tmp_path, HEALTHY, minutes=28)
    out = str(tmp_path / "job" / "profiler-output")
    write_steps(out, "algo-1", 0, _steps(START + 25 * 60, 30, 1.0))
    write_steps(out, "algo-1", 1, _steps(START + 25 * 60, 30, 1.0))
    result = replay(source, None, scrape_interval=scrape)
    verdict = result.rules["MaxInitializationTime"]
    assert verdict.fired and verdict.alerts[0].labels["training_job"] == "job"
    # started at t0, 20 minutes later the first evaluation above 1200 s is at t0 + 21m.
    assert verdict.first_fired_at == T0 + 21 * 60


def test_a_step_on_any_rank_before_the_deadline_keeps_initialization_quiet(tmp_path, promtool):
    source = job(tmp_path, HEALTHY, minutes=25)
    out = str(tmp_path / "job" / "profiler-output")
    write_steps(out, "algo-1", 0, _steps(START + 23 * 60, 10, 1.0))
    write_steps(out, "algo-2", 1, _steps(START + 5 * 60, 10, 1.0))
    assert not replay(source, None, scrape_interval=15).rules["MaxInitializationTime"].fired


def test_framework_traces_alone_replay_the_framework_rules(tmp_path, promtool):
    out = str(tmp_path / "job" / "profiler-output")
    write_steps(out, "algo-1", 0, _steps(START, 300, 0.2, slow=range(120, 300, 10)))
    result = replay(str(tmp_path / "job"), None, scrape_interval=15)
    assert result.rules["StepOutlier"].fired
    assert any("no system metrics" in n for n in result.notes)

"""benchmarks/gpu_check.py where there is no GPU: it says so and exits 0, and the parts that
need no device (nvidia-smi's CSV, the comparisons, the table) do what the device run needs."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys

import pytest

from conftest import ROOT

SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
SMI_CSV = ROOT / "tests" / "data" / "nvidia-smi-query-gpu.csv"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*args: str, path: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_without_nvidia_smi_it_says_so_and_exits_0(tmp_path):
    result = run(path=str(tmp_path))  # nothing on PATH: no nvidia-smi
    assert result.returncode == 0, result.stderr
    assert "no NVIDIA GPU to check here: nvidia-smi is not installed" in result.stdout


def test_a_gpu_but_torch_without_cuda_says_so_and_exits_0(tmp_path):
    smi = tmp_path / "nvidia-smi"  # prints what nvidia-smi prints for two H100s
    smi.write_text(f"#!/bin/sh\ncat '{SMI_CSV}'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    result = run(path=f"{tmp_path}:{os.environ['PATH']}")
    assert result.returncode == 0, result.stderr
    assert "has no CUDA" in result.stdout  # this machine's torch is the CPU build


def test_nvidia_smi_csv_is_read_with_units_and_missing_fields(gpu_check):
    rows = gpu_check.parse_smi_csv(SMI_CSV.read_text())
    assert [r["index"] for r in rows] == [0.0, 1.0]
    assert rows[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert rows[0]["memory.used"] == 20480.0 and rows[0]["power.draw"] == 312.5
    assert rows[0]["utilization.gpu"] == 5.0 and rows[0]["clocks.sm"] == 1980.0
    assert rows[1]["power.draw"] is None  # [N/A]
    with pytest.raises(ValueError, match="has 2 fields"):
        gpu_check.parse_smi_csv("index, name, memory.used [MiB]\n0, H100\n")


def test_the_exporter_agrees_with_nvidia_smi_within_the_tolerances(gpu_check):
    # The golden scrape is the real exporter over NVML faked with the driver's own shapes.
    ours = gpu_check.exporter_readings((ROOT / "tests" / "golden" / "exporter.prom").read_text())
    smi = gpu_check.parse_smi_csv(SMI_CSV.read_text())
    rows = gpu_check.compare_readings(ours, smi)
    verdicts = {what: verdict for _, what, _, _, _, verdict in rows}
    assert verdicts["GPU 0 memory.total"] == "ok" and verdicts["GPU 0 power.draw"] == "ok"
    assert verdicts["GPU 1 power.draw"] == "skipped"  # neither side reads it
    assert "FAIL" not in verdicts.values()
    smi[0]["temperature.gpu"] = 70.0  # 9 degrees off: more than the 2 allowed
    smi[1]["uuid"] = "GPU-ffffffff-0000-0000-0000-000000000000"  # a GPU the exporter lacks
    verdicts = {what: v for _, what, _, _, _, v in gpu_check.compare_readings(ours, smi)}
    assert verdicts["GPU 0 temperature.gpu"] == "FAIL" and verdicts["GPU 1"] == "FAIL"


def test_the_trace_comparison_holds_hta_s_tolerance(gpu_check):
    ours = {
        "span_seconds": 1.0,
        "idle_seconds": 0.2,
        "gpu_time_seconds": {"compute": 0.7, "compute+memory": 0.05, "memory": 0.05},
        "top_kernels": [{"name": "gemm"}, {"name": "relu"}],
    }
    theirs = {
        "kernel_time_us": 1_000_500.0,  # 0.5 ms off: under the 1 ms floor
        "idle_time_us": 200_000.0,
        "compute_time_us": 750_000.0,
        "kernels": [{"name": "gemm"}, {"name": "relu"}, {"name": "copy"}],
    }
    assert {r[5] for r in gpu_check.compare_trace(ours, theirs)} == {"ok"}
    theirs["idle_time_us"] = 260_000.0  # 60 ms off: over 2 % of 0.26 s
    theirs["kernels"] = [{"name": "relu"}, {"name": "gemm"}]
    verdicts = [r[5] for r in gpu_check.compare_trace(ours, theirs)]
    assert verdicts == ["ok", "FAIL", "ok", "FAIL"]


def test_the_table_is_one_markdown_table_under_its_caption(gpu_check):
    rows = [("exporter", "GPU 0 memory.total", "8.59e+10", "8.59e+10", "0", "ok")]
    table = gpu_check.format_table(rows, "caption").splitlines()
    assert table[0] == "caption" and table[2].startswith("| section |")
    assert table[-1] == "| exporter | GPU 0 memory.total | 8.59e+10 | 8.59e+10 | 0 | ok |"


def test_the_trace_section_on_a_recorded_a100_trace_agrees_with_hta(gpu_check, hta_peer):
    """The device run's trace section, on a trace an A100 wrote: trainprof's summary and
    HTA's (tests/hta_peer.py, the peer the hta_peer fixture finds) agree within tolerance."""
    trace = ROOT / "tests" / "data" / "real-gpu-traces" / "a100-alexnet.pt.trace.json.gz"
    rows = gpu_check.check_trace(trace)
    assert [r[1] for r in rows] == [
        "GPU span, s",
        "GPU idle, s",
        "compute time, s",
        "top 15 kernels, by name",
    ]
    assert {r[5] for r in rows} == {"ok"}

"""Live kernel profile windows: a CPU-only torch.profiler run end to end (CPU operators
recorded, GPU series absent and said so), the schedule, retention, bad settings, and the
bounded series the real GPU traces fold into."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

import trainprof
from trainprof.contract.sampling import sample_value
from trainprof.trace import read_trace, summarize
from trainprof.trace.live import KernelProfile
from trainprof.trace.series import KernelSeries

torch = pytest.importorskip("torch")
TRACES = Path(__file__).resolve().parent / "data" / "real-gpu-traces"
NCCL = TRACES / "a100-nccl-training.pt.trace.json.gz"
IDENT = (["training_job", "rank"], ["j", "0"])


def samples(families) -> dict[tuple, float]:
    out = {}
    for family in families:
        for s in family.samples:
            out[
                (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in IDENT[0])))
            ] = s.value
    return out


def train(steps: int, pause: float = 0.0) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        with trainprof.step():
            model(torch.randn(16, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
        if pause:
            time.sleep(pause)


@pytest.fixture
def session():
    trainprof.stop()
    yield
    trainprof.stop()


def test_cpu_only_windows_end_to_end(session, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="trainprof")
    s = trainprof.start(
        serve=False,
        training_job="cpu-job",
        kernel_profile=f"steps=4,every=0.2s,first=3,keep=2,dir={tmp_path}",
    )
    deadline = time.monotonic() + 60  # a loaded machine writes traces slowly: train on
    while time.monotonic() < deadline:
        train(10, pause=0.01)
        assert s._kernel.wait_idle()
        windows = s.value("trainprof_kernel_profile_windows_total", gpu_activity="no")
        if windows and windows >= 3:
            break
    assert windows and windows >= 3
    assert s.value("trainprof_kernel_profiled_steps_total") == 4 * windows
    assert s.value("trainprof_kernel_cpu_op_seconds_total", op="aten::addmm") > 0
    names = {f.name for f in s.families()}
    # no GPU activity: GPU series absent, not zeros
    for absent in ("trainprof_kernel_gpu_busy", "trainprof_kernel", "trainprof_kernel_span"):
        assert f"{absent}_seconds" not in names
    assert "trainprof_kernel_launch_latency_seconds" not in names
    traces = sorted(tmp_path.glob("cpu-job-rank0-*.pt.trace.json.gz"))
    assert len(traces) == 2  # keep=2
    trace = read_trace(traces[-1])  # a real Kineto trace, readable by the offline path
    # The window stops the profiler at a step boundary: its last step is whole, and the
    # series count it; offline, HTA's window leaves it out.
    assert summarize(trace, include_last_step=True)["steps"]["count"] == 4
    assert summarize(trace)["steps"]["count"] == 3
    said = [r.getMessage() for r in caplog.records if "no GPU activity" in r.getMessage()]
    assert len(said) == 1 and "cpu-job-rank0-" in said[0]  # said once, with the path
    assert any(str(traces[-1]) in r.getMessage() for r in caplog.records)


def test_no_window_before_first_steps_nor_between_windows(session, tmp_path):
    s = trainprof.start(
        serve=False, training_job="sched", kernel_profile=f"steps=2,every=1h,first=5,dir={tmp_path}"
    )
    train(4)
    assert s._kernel._profiler is None and not list(tmp_path.iterdir())
    train(3)  # step 5 ends -> window opens; steps 6, 7 profiled
    assert s._kernel.wait_idle()
    assert len(list(tmp_path.iterdir())) == 1
    train(20)  # every=1h: no second window
    assert s._kernel.wait_idle()
    assert len(list(tmp_path.iterdir())) == 1
    assert s.value("trainprof_kernel_profiled_steps_total") == 2


def test_off_by_default_and_from_the_environment(session, tmp_path, monkeypatch):
    s = trainprof.start(serve=False, training_job="off")
    assert s._kernel is None
    assert not any(f.name.startswith("trainprof_kernel") for f in s.families())
    trainprof.stop()
    monkeypatch.setenv("TRAINPROF_KERNEL_PROFILE", f"steps=2,first=1,dir={tmp_path}")
    s = trainprof.start(serve=False, training_job="env")
    assert s._kernel is not None and s._kernel.config.steps == 2


@pytest.mark.parametrize(
    "value, message",
    [
        ("steps=0", "steps must be at least 1"),
        ("stepz=3", "unknown setting 'stepz'"),
        ("every=soon", "every"),
        ("steps", "'steps' is not key=value"),
    ],
)
def test_bad_settings_warn_and_training_goes_on(session, caplog, value, message):
    s = trainprof.start(serve=False, training_job="bad", kernel_profile=value)
    assert s._kernel is None
    text = " ".join(r.getMessage() for r in caplog.records)
    assert message in text and "kernel profiling is off" in text
    train(2)
    assert s.value("trainprof_training_steps_total", mode="train") == 2


def test_settings_parse():
    assert KernelProfile.parse(None) is None and KernelProfile.parse("off") is None
    assert KernelProfile.parse(True) == KernelProfile()
    assert KernelProfile.parse({"steps": 5, "every": "2m"}).every == 120.0


def test_real_trace_folds_into_bounded_series():
    trace = read_trace(NCCL)
    s = summarize(trace, top=1000, include_last_step=True)
    series = KernelSeries(top=5, max_labels=8)
    series.add_window(trace, steps=3, overhead=0.01)
    got = samples(series.families(*IDENT))
    kernels = {k[1][0][1]: v for k, v in got.items() if k[0] == "trainprof_kernel_seconds_total"}
    # top 5 under short names (two elementwise kernels share one) + other
    assert len(kernels) == 5 and "other" in kernels and "vectorized_elementwise_kernel" in kernels
    assert sum(kernels.values()) == pytest.approx(s["kernels"]["seconds"])
    assert kernels["ncclKernel_AllReduce_RING_LL_Sum_float"] == pytest.approx(0.046762159)
    busy = {
        k[1][0][1]: v for k, v in got.items() if k[0] == "trainprof_kernel_gpu_busy_seconds_total"
    }
    span = got[("trainprof_kernel_span_seconds_total", ())]
    idle = got[("trainprof_kernel_gpu_idle_seconds_total", ())]
    assert sum(busy.values()) == pytest.approx(span - idle)
    assert (
        got[("trainprof_kernel_launch_latency_seconds_count", ())]
        == s["launch_latency_seconds"]["count"]
    )
    gpu = [k for k in got if k[0] == "trainprof_kernel_gpu_info"]
    assert dict(gpu[0][1]) == {"gpu_name": "NVIDIA A100-PG509-200", "tensor_cores": "true"}
    tf32 = got[
        (
            "trainprof_kernel_precision_seconds_total",
            (("kernel_class", "matmul"), ("precision", "tf32")),
        )
    ]
    assert tf32 == pytest.approx(s["matmul_precision_seconds"]["tf32"])
    # more windows with other kernels: the kernel label set stays within max_labels + other
    for name in ("a100-alexnet", "mi250-toy-train"):
        series.add_window(read_trace(TRACES / f"{name}.pt.trace.json.gz"), steps=1, overhead=0)
    got = samples(series.families(*IDENT))
    kernels = [k for k in got if k[0] == "trainprof_kernel_seconds_total"]
    assert len(kernels) <= 8 + 1
    assert (
        sample_value(
            series.families(*IDENT), "trainprof_kernel_profile_windows_total", gpu_activity="yes"
        )
        == 3
    )


def test_a_profiler_already_running_skips_the_window_once(session, tmp_path, caplog):
    s = trainprof.start(
        serve=False, training_job="busy", kernel_profile=f"steps=2,every=1h,first=1,dir={tmp_path}"
    )
    with torch.profiler.profile():  # the user's own profiler holds the profiler
        train(5)
    errors = s.value("trainprof_instrumentation_errors_total")
    assert errors == 0
    said = [r.getMessage() for r in caplog.records if "window not started" in r.getMessage()]
    assert len(said) == 1  # once, then the next try waits `every`
    assert s.value("trainprof_training_steps_total", mode="train") == 5

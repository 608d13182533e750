"""The trace summary on small hand-made traces (every figure worked out by hand in the
comment next to it), bad input, and the `trainprof trace summarize` command line."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainprof.trace import classify, read_trace, summarize

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "tests" / "data" / "real-gpu-traces"


def kernel(name, ts, dur, cat="kernel", correlation=None, **args):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 0,
        "tid": 7,
        "ts": ts,
        "dur": dur,
        "args": {"device": 0, "stream": 7, "correlation": correlation, **args},
    }


def launch(ts, correlation, name="cudaLaunchKernel"):
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": 1,
        "args": {"correlation": correlation},
    }


def write(tmp_path: Path, events, name="t.json", **extra) -> Path:
    path = tmp_path / name
    text = json.dumps({"traceEvents": events, **extra})
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


# compute [0,10) us, NCCL [5,20), memcpy [15,30), memset [40,50):
#   compute alone [0,5)=5, compute+communication [5,10)=5, communication alone [10,15)=5,
#   communication+memory [15,20)=5, memory alone [20,30)+[40,50)=20, idle [30,40)=10.
OVERLAPPING = [
    kernel("ampere_fp16_s16816gemm_fp16_128x128_nn", 0, 10, correlation=1),
    kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", 5, 15, correlation=2),
    kernel("Memcpy HtoD (Pageable -> Device)", 15, 15, cat="gpu_memcpy", bytes=4096),
    kernel("Memset (Device)", 40, 10, cat="gpu_memset"),
    launch(-3, 1),
    launch(0, 2),
]


def test_overlap_classes_span_and_idle(tmp_path):
    s = summarize(read_trace(write(tmp_path, OVERLAPPING)))
    assert s["span_seconds"] == pytest.approx(50e-6)
    assert s["idle_seconds"] == pytest.approx(10e-6)
    assert s["gpu_time_seconds"] == pytest.approx(
        {
            "compute": 5e-6,
            "compute+communication": 5e-6,
            "communication": 5e-6,
            "communication+memory": 5e-6,
            "memory": 20e-6,
        }
    )
    assert sum(s["gpu_time_seconds"].values()) == pytest.approx(40e-6)


def test_top_kernels_activity_precision_and_latency(tmp_path):
    events = OVERLAPPING + [kernel("Memset (Device)", 60, 2, cat="gpu_memset")]
    s = summarize(read_trace(write(tmp_path, events)), top=2)
    # 15 us each: equal times go by name
    assert [(k["name"], k["launches"]) for k in s["top_kernels"]] == [
        ("Memcpy HtoD (Pageable -> Device)", 1),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", 1),
    ]
    assert s["top_kernels_by_launches"][0] == {
        "name": "Memset (Device)",
        "seconds": pytest.approx(12e-6),
        "launches": 2,
    }
    assert s["activity_seconds"] == pytest.approx(
        {"kernel": 10e-6, "collective": 15e-6, "memcpy_htod": 15e-6, "memset": 12e-6}
    )
    assert s["precision_seconds"] == pytest.approx({"fp16": 10e-6, "fp32": 15e-6})
    # launches at -3 us and 0 us, kernels start at 0 and 5: latencies 3 and 5 us
    latency = s["launch_latency_seconds"]
    assert latency["count"] == 2
    assert latency["mean"] == pytest.approx(4e-6)
    assert latency["max"] == pytest.approx(5e-6)
    memcpy = s["memory_operations"]["Memcpy HtoD (Pageable -> Device)"]
    assert memcpy == {"count": 1, "seconds": pytest.approx(15e-6), "bytes": 4096, "pageable": True}


def test_a_driver_call_inside_the_runtime_call_does_not_shorten_the_latency(tmp_path):
    driver = launch(-1, 1, name="cuLaunchKernel") | {"cat": "cuda_driver"}
    s = summarize(read_trace(write(tmp_path, [*OVERLAPPING, driver])))
    assert s["launch_latency_seconds"]["max"] == pytest.approx(5e-6)
    assert s["launch_latency_seconds"]["mean"] == pytest.approx(4e-6)  # 3 us from -3, not 1


def test_steps_and_idle_inside_steps(tmp_path):
    def annotation(name, ts, dur):
        return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur}

    # step 1 on the host [0,100) launches kernels running [10,20) and [50,60): its GPU
    # window is [10,60) with 30 us idle inside; step 2 [100,150) launches [120,130).
    events = [
        annotation("ProfilerStep#1", 0, 100),
        annotation("ProfilerStep#2", 100, 50),
        annotation("forward", 5, 20),
        annotation("forward", 105, 30),
        launch(5, 1),
        launch(40, 2),
        launch(110, 3),
        kernel("k", 10, 10, correlation=1),
        kernel("k", 50, 10, correlation=2),
        kernel("k", 120, 10, correlation=3),
    ]
    s = summarize(read_trace(write(tmp_path, events)), include_last_step=True)
    assert s["steps"]["count"] == 2
    assert s["steps"]["durations_seconds"] == pytest.approx([100e-6, 50e-6])
    assert s["steps"]["gpu_idle_in_steps_seconds"] == pytest.approx(30e-6)
    assert s["idle_seconds"] == pytest.approx(90e-6)  # [20,50) + [60,120)
    forward = s["annotations"]["forward"]
    assert forward["count"] == 2 and forward["seconds"] == pytest.approx(50e-6)
    assert "ProfilerStep#1" not in s["annotations"]


def test_rank_from_distributed_info(tmp_path):
    path = write(tmp_path, OVERLAPPING, "r3.json.gz", distributedInfo={"rank": 3})
    assert read_trace(path).rank == 3
    assert read_trace(write(tmp_path, OVERLAPPING, "r0.json")).rank == 0


def test_malformed_events_are_skipped_and_counted(tmp_path):
    events = OVERLAPPING + [
        {"ph": "X", "cat": "kernel", "name": "no_ts", "dur": 3},
        {"ph": "X", "cat": "kernel", "name": "bad", "ts": "x", "dur": 3},
        {"ph": "X", "cat": "kernel", "name": "negative", "ts": 1, "dur": -3},
        "not an event",
    ]
    trace = read_trace(write(tmp_path, events))
    assert trace.skipped == 4
    assert summarize(trace)["span_seconds"] == pytest.approx(50e-6)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("volta_sgemm_128x64_nn", "fp32"),
        ("sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x32", "fp16"),
        ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(P)", "tf32"),
        ("volta_h884gemm_64x128_ldg8_nn", "fp16"),
        ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_nn", "bf16"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add"
            "<c10::BFloat16>, at::detail::Array<char*, 3> >(int, X)",
            "bf16",
        ),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctorOnSelf_add"
            "<long>, at::detail::Array<char*, 2> >(int, X)",
            "int",
        ),
        ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float>(X)", "fp32"),
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*)", "int8"),
        ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1", "fp16"),
        ("Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32", "fp32"),
        ("_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel", "unknown"),
    ],
)
def test_precision_classes(name, expected):
    assert classify.precision(name) == expected


def test_short_names_are_bounded():
    long_name = "sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tile"
    assert len(classify.short_name(long_name)) == classify.SHORT_NAME_LIMIT
    assert classify.short_name("void cudnn::ops::nchwToNhwcKernel<float, float>(a, b)") == (
        "nchwToNhwcKernel"
    )


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "trace", "summarize", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_json_contract(tmp_path):
    a = write(tmp_path, OVERLAPPING, "a.json", distributedInfo={"rank": 0})
    b = write(tmp_path, OVERLAPPING[:2], "b.json.gz", distributedInfo={"rank": 1})
    result = _cli(a, b, "--json", "-")
    assert result.returncode == 0, result.stderr
    ranks = json.loads(result.stdout)["ranks"]
    assert sorted(ranks) == ["0", "1"]
    for key in (
        "span_seconds",
        "idle_seconds",
        "gpu_time_seconds",
        "top_kernels",
        "precision_seconds",
        "activity_seconds",
        "launch_latency_seconds",
    ):
        assert key in ranks["0"], key
    assert ranks["1"]["gpu_time_seconds"] == pytest.approx(
        {"compute": 5e-6, "compute+communication": 5e-6, "communication": 10e-6}
    )


def test_cli_text_on_a_real_trace():
    result = _cli(TRACES / "mi250-toy-train.pt.trace.json.gz", "--top", "2")
    assert result.returncode == 0, result.stderr
    assert "rank 0" in result.stdout and "AMD Radeon Graphics" in result.stdout
    assert "Memcpy HtoD (Host -> Device)" in result.stdout


def test_cli_bad_traces_are_reported_and_skipped(tmp_path):
    good = write(tmp_path, OVERLAPPING, "good.json")
    truncated = tmp_path / "truncated.json.gz"
    truncated.write_bytes(gzip.compress(json.dumps({"traceEvents": OVERLAPPING}).encode())[:60])
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps({"traceEvents": OVERLAPPING})[:-40])
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    duplicate = write(tmp_path, OVERLAPPING, "dup.json")
    bad_rank = write(tmp_path, OVERLAPPING, "badrank.json", distributedInfo={"rank": "x"})
    result = _cli(
        good, truncated, cut, other, duplicate, bad_rank, tmp_path / "missing.json", "--json", "-"
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert list(json.loads(result.stdout)["ranks"]) == ["0"]
    for fragment in (
        "truncated.json.gz: damaged or truncated gzip",
        "cut.json: not valid JSON at line 1",
        "other.json: no traceEvents list",
        "dup.json: rank 0 again",
        "badrank.json: distributedInfo.rank is 'x'",
        "missing.json: cannot read",
    ):
        assert fragment in result.stderr, fragment


def test_cli_nothing_readable_exits_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    result = _cli(bad)
    assert result.returncode == 2 and "bad.json" in result.stderr and not result.stdout

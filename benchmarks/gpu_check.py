"""trainprof against a real NVIDIA GPU, in one table, in under 8 minutes.

    python benchmarks/gpu_check.py [--steps 200] [--rounds 5] [--budget 420] [--markdown]
    make gpu-check                       # GPU_PY=python3 to use a torch with CUDA elsewhere

What the tests check against faithful fakes and recorded traces, checked on the device:

1. exporter: `trainprof exporter` with the real NVML, scraped while `nvidia-smi
   --query-gpu` reads the same GPUs: memory (exact), temperature, power, SM clock and
   utilization, within the tolerances of COMPARED (the two sample at different instants).
2. training: a small transformer trains on the GPU uninstrumented, under `trainprof.start()`
   with a step and three phases, with `watch()` at save_interval 100 and 10, and with a
   `kernel_profile` window; variants interleaved round by round, the median ms per step
   (min-max) and its ratio to the uninstrumented loop taken within each round.
3. trace: the window's trace summarised by `trainprof trace summarize` and by Holistic Trace
   Analysis (tests/hta_peer.py, in its own process): GPU span, idle, compute time and the
   top kernels, within max(1 ms, 2 %) as tests/test_trace_hta.py holds them.

On a machine without an NVIDIA GPU (no nvidia-smi, no GPU listed, or torch without CUDA) it
says so and exits 0. A section that would run past --budget seconds is skipped and says so.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SMI_QUERY = (
    "index",
    "uuid",
    "name",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "power.draw",
    "temperature.gpu",
    "clocks.sm",
)
# nvidia-smi field -> (trainprof gauge, factor from nvidia-smi's unit to trainprof's).
FIELDS = {
    "utilization.gpu": ("trainprof_gpu_utilization_ratio", 0.01),
    "memory.used": ("trainprof_gpu_memory_used_bytes", 1024.0 * 1024.0),
    "memory.total": ("trainprof_gpu_memory_total_bytes", 1024.0 * 1024.0),
    "power.draw": ("trainprof_gpu_power_watts", 1.0),
    "temperature.gpu": ("trainprof_gpu_temperature_celsius", 1.0),
    "clocks.sm": ("trainprof_gpu_sm_clock_hertz", 1e6),
}
MIB = 1024.0 * 1024.0
# field -> (absolute tolerance, relative tolerance, why): readings sampled a moment apart.
COMPARED = {
    "memory.total": (0.0, 0.0, "fixed"),
    "memory.used": (64 * MIB, 0.0, "allocations between the two reads"),
    "temperature.gpu": (2.0, 0.0, "degrees"),
    "power.draw": (15.0, 0.10, "averaged over different windows"),
    "clocks.sm": (60e6, 0.05, "boost clocks move"),
    "utilization.gpu": (0.25, 0.0, "sampled over different periods"),
}


# --- nvidia-smi ----------------------------------------------------------------------------


def parse_smi_csv(text: str) -> list[dict[str, str | float | None]]:
    """Rows of `nvidia-smi --query-gpu=... --format=csv`: the header names the fields (with
    their units in brackets), values carry units ("45 %", "1024 MiB", "69.88 W"); numbers
    come back without them, "[N/A]" and "[Not Supported]" as None, text as text.

    >>> rows = parse_smi_csv("index, name, memory.used [MiB], power.draw [W]\\n"
    ...                      "0, NVIDIA H100 80GB HBM3, 1 MiB, [N/A]\\n")
    >>> rows
    [{'index': 0.0, 'name': 'NVIDIA H100 80GB HBM3', 'memory.used': 1.0, 'power.draw': None}]
    """
    reader = csv.reader(text.strip().splitlines(), skipinitialspace=True)
    header = next(reader, None)
    if header is None:
        return []
    fields = [h.split(" [")[0].strip() for h in header]
    rows = []
    for line in reader:
        if not line:
            continue
        if len(line) != len(fields):
            raise ValueError(f"nvidia-smi row {line!r} has {len(line)} fields, not {len(fields)}")
        rows.append({f: _smi_value(f, v.strip()) for f, v in zip(fields, line)})
    return rows


def _smi_value(field: str, value: str) -> str | float | None:
    if value.startswith("[") or value in ("N/A", ""):
        return None
    if field in ("uuid", "name", "pci.bus_id", "driver_version"):
        return value
    number = value.split(" ")[0]
    try:
        return float(number)
    except ValueError:
        return value


def query_smi(smi: str = "nvidia-smi") -> list[dict[str, str | float | None]]:
    out = subprocess.run(
        [smi, f"--query-gpu={','.join(SMI_QUERY)}", "--format=csv"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if out.returncode != 0:
        raise RuntimeError(f"nvidia-smi failed: {out.stderr.strip() or out.stdout.strip()}")
    return parse_smi_csv(out.stdout)


# --- the comparison ------------------------------------------------------------------------


Row = tuple[str, str, str, str, str, str]  # section, what, trainprof, peer, difference, verdict


def exporter_readings(exposition: str) -> dict[str, dict[str, float]]:
    """{uuid: {gauge: value}} of the GPU gauges in an exporter's /metrics text."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {name for name, _ in FIELDS.values()}
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            if s.name in wanted and "uuid" in s.labels:
                out.setdefault(s.labels["uuid"], {})[s.name] = s.value
    return out


def compare_readings(
    ours: dict[str, dict[str, float]], smi: Iterable[dict[str, str | float | None]]
) -> list[Row]:
    """One row per GPU and field both sides read, with its verdict (COMPARED's tolerance)."""
    rows: list[Row] = []
    for gpu in smi:
        uuid = str(gpu.get("uuid"))
        label = f"GPU {int(gpu['index'])}" if isinstance(gpu.get("index"), float) else uuid
        mine = ours.get(uuid)
        if mine is None:
            rows.append(("exporter", label, "absent", uuid, "", "FAIL"))
            continue
        for field, (absolute, relative, _) in COMPARED.items():
            gauge, factor = FIELDS[field]
            theirs = gpu.get(field)
            value = mine.get(gauge)
            if not isinstance(theirs, float) or value is None:
                shown = "n/a" if value is None else _num(value)
                rows.append(("exporter", f"{label} {field}", shown, "n/a", "", "skipped"))
                continue
            peer = theirs * factor
            diff = value - peer
            ok = abs(diff) <= max(absolute, relative * abs(peer))
            rows.append(
                (
                    "exporter",
                    f"{label} {field}",
                    _num(value),
                    _num(peer),
                    _num(diff),
                    "ok" if ok else "FAIL",
                )
            )
    return rows


def _num(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e6 or abs(value) < 1e-3:
        return f"{value:.4g}"
    return f"{value:.4g}" if abs(value) < 100 else f"{value:.1f}"


def format_table(rows: Sequence[Row], caption: str) -> str:
    """The one table the script prints: markdown, a caption above it.

    >>> print(format_table([("exporter", "GPU 0 memory.total", "8.59e+10", "8.59e+10", "0",
    ...                       "ok")], "gpu_check.py"))
    gpu_check.py
    <BLANKLINE>
    | section | check | trainprof | peer | difference | verdict |
    |---|---|---|---|---|---|
    | exporter | GPU 0 memory.total | 8.59e+10 | 8.59e+10 | 0 | ok |
    """
    lines = [caption, "", "| section | check | trainprof | peer | difference | verdict |"]
    lines.append("|---|---|---|---|---|---|")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# --- the device ----------------------------------------------------------------------------


def gpu_absent(smi: str | None) -> str | None:
    """Why there is nothing to check here (None: an NVIDIA GPU and torch with CUDA)."""
    if smi is None:
        return "nvidia-smi is not installed"
    try:
        gpus = query_smi(smi)
    except (OSError, RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
        return f"nvidia-smi lists no GPU ({e})"
    if not gpus:
        return "nvidia-smi lists no GPU"
    try:
        import torch
    except ImportError:
        return "torch is not installed (the training checks need torch with CUDA)"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} has no CUDA (run with a CUDA build: GPU_PY=...)"
    return None


def check_exporter(smi: str) -> list[Row]:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainprof.cli",
            "exporter",
            "--web.listen-address",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 60
        body = ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    body = r.read().decode()
                if "trainprof_gpu_memory_total_bytes" in body:
                    break
            except OSError:
                if proc.poll() is not None:
                    error = proc.stderr.read()[-2000:] if proc.stderr else ""
                    raise RuntimeError(f"the exporter exited: {error}") from None
            time.sleep(0.5)
        time.sleep(1.0)  # a sample taken after the first scrape
        with urllib.request.urlopen(url, timeout=5) as r:
            body = r.read().decode()
        smi_rows = query_smi(smi)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    return compare_readings(exporter_readings(body), smi_rows)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_training(steps: int, rounds: int, trace_dir: str) -> tuple[list[Row], Path | None]:
    """Per-step time of each variant against the uninstrumented loop, interleaved."""
    import torch

    sys.path.insert(0, str(HERE))
    from _interleave import Spread, ratios

    import trainprof
    import trainprof.torch as tt

    device = torch.device("cuda")
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True, dropout=0.0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(8000, 256),
        torch.nn.TransformerEncoder(layer, 4, enable_nested_tensor=False),
    ).to(device)
    head = torch.nn.Linear(256, 10).to(device)
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.SGD(params, lr=1e-3)
    x = torch.randint(0, 8000, (32, 256), device=device)
    y = torch.randint(0, 10, (32,), device=device)
    traces: list[Path] = []

    def loop(instrument: str) -> Callable[[], float]:
        def measure() -> float:
            trainprof.stop()
            watcher = None
            if instrument != "uninstrumented":
                profile = None
                if instrument == "kernel_profile":  # one 20-step window per round
                    profile = f"steps=20,every=1h,first=5,dir={trace_dir}"
                trainprof.start(serve=False, kernel_profile=profile)
            if "watch" in instrument:
                interval = int(instrument.split("=")[1].rstrip(")"))
                watcher = tt.watch(model, opt, save_interval=interval)
            timed = instrument != "uninstrumented"
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                if timed:
                    with trainprof.step():
                        with trainprof.phase("forward"):
                            out = head(model(x).mean(dim=1))
                            loss = torch.nn.functional.cross_entropy(out, y)
                        with trainprof.phase("backward"):
                            loss.backward()
                        with trainprof.phase("optimizer"):
                            opt.step()
                            opt.zero_grad()
                    if watcher is not None:
                        trainprof.log_loss(loss)
                        watcher.log_predictions(y, out)
                else:
                    out = head(model(x).mean(dim=1))
                    torch.nn.functional.cross_entropy(out, y).backward()
                    opt.step()
                    opt.zero_grad()
            torch.cuda.synchronize()
            elapsed = (time.perf_counter() - t0) / steps * 1e3
            if watcher is not None:
                watcher.close()
            kernel = trainprof.current()._kernel
            if kernel is not None:
                kernel.wait_idle(120)
                traces.extend(kernel.traces)
            trainprof.stop()
            return elapsed

        return measure

    variants = [
        "uninstrumented",
        "start() + step + 3 phases",
        "+ watch(save_interval=100)",
        "+ watch(save_interval=10)",
        "kernel_profile",
    ]
    loop("uninstrumented")()  # warm up: cuDNN, allocator, kernels compiled
    results: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            results[v].append(loop(v)())
    base = Spread(results["uninstrumented"])
    rows: list[Row] = [("training", "uninstrumented, ms/step", base.cell("{:.3f}"), "", "", "")]
    for v in variants[1:]:
        ms = Spread(results[v])
        ratio = ratios(results, v, "uninstrumented")
        rows.append(
            (
                "training",
                f"{v}, ms/step",
                ms.cell("{:.3f}"),
                base.cell("{:.3f}"),
                f"x{ratio.cell('{:.3f}')}",
                "",
            )
        )
    return rows, (traces[-1] if traces else None)


def check_trace(path: Path) -> list[Row]:
    """The window's trace summarised by trainprof and by HTA (tests/hta_peer.py)."""
    ours_run = subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "trace", "summarize", str(path), "--json", "-"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if ours_run.returncode != 0:
        return [("trace", "trainprof trace summarize", "failed", "", "", "FAIL")]
    ours = next(iter(json.loads(ours_run.stdout)["ranks"].values()))
    peer_run = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "hta_peer.py"), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if peer_run.returncode != 0:
        why = "HTA not installed" if "No module named" in peer_run.stderr else "HTA failed"
        return [("trace", "span, idle, compute, kernels", "", why, "", "skipped")]
    return compare_trace(ours, json.loads(peer_run.stdout))


def compare_trace(ours: dict, theirs: dict) -> list[Row]:
    """trainprof's summary against HTA's, as tests/test_trace_hta.py compares them."""
    compute = sum(v for k, v in ours["gpu_time_seconds"].items() if "compute" in k)
    pairs = [
        ("GPU span", ours["span_seconds"], theirs["kernel_time_us"] / 1e6),
        ("GPU idle", ours["idle_seconds"], theirs["idle_time_us"] / 1e6),
        ("compute time", compute, theirs["compute_time_us"] / 1e6),
    ]
    rows: list[Row] = []
    for what, mine, peer in pairs:
        ok = abs(mine - peer) <= max(1e-3, 0.02 * abs(peer))
        rows.append(
            ("trace", f"{what}, s", f"{mine:.6f}", f"{peer:.6f}", f"{mine - peer:+.6f}", _ok(ok))
        )
    top = ours.get("top_kernels", [])
    names = [k["name"] for k in theirs["kernels"][: len(top)]]
    same = [k["name"] for k in top] == names
    rows.append(("trace", f"top {len(top)} kernels, by name", "", "", "", _ok(same)))
    return rows


def _ok(ok: bool) -> str:
    return "ok" if ok else "FAIL"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per variant per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=420.0, help="seconds, all sections")
    parser.add_argument("--smi", default=shutil.which("nvidia-smi"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    started = time.monotonic()
    absent = gpu_absent(args.smi)
    if absent is not None:
        print(f"gpu_check: no NVIDIA GPU to check here: {absent}. Nothing run.")
        return 0
    gpus = query_smi(args.smi)
    names = ", ".join(sorted({str(g.get("name")) for g in gpus}))
    rows: list[Row] = check_exporter(args.smi)
    trace = None
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as traces:
        if time.monotonic() - started < args.budget / 2:
            training, trace = check_training(args.steps, args.rounds, traces)
            rows += training
        else:
            rows.append(("training", "all variants", "", "", "", "skipped: time"))
        if trace is not None and time.monotonic() - started < args.budget:
            rows += check_trace(trace)
        else:
            rows.append(("trace", "trainprof vs HTA", "", "", "", "skipped: no trace or time"))
    import torch

    caption = (
        f"gpu_check.py on {len(gpus)} x {names} ({time.strftime('%Y-%m-%d')}; torch "
        f"{torch.__version__}, CUDA {torch.version.cuda}; {args.rounds} interleaved rounds of "
        f"{args.steps} steps; {time.monotonic() - started:.0f} s)"
    )
    print(format_table(rows, caption))
    return 1 if any(r[5] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())

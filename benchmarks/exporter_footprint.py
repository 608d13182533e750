"""What the exporter DaemonSet needs: CPU and memory with 8 fake GPUs, as the chart requests them.

    python benchmarks/exporter_footprint.py [--seconds 120] [--scrape-interval 15] [--gpus 8]
                                            [--dcgm-exporter]

Runs the exporter (benchmarks/fake_gpu_exporter.py: the real NVML source over tests/fakes.py,
the real host collectors, sampling every 0.5 s; with --dcgm-exporter, `trainprof exporter
--collector.gpu.dcgm-exporter` reading every second a dcgm-exporter body of --gpus GPUs built
from the real capture, served from this process by tests/real_exporters.py) and reports
  steady      process CPU as % of one core while Prometheus scrapes every --scrape-interval
  storm       CPU seconds per scrape and the peak RSS (VmHWM) over 2,000 back-to-back scrapes
  rss         VmRSS at the end and the peak over the whole run
The chart's requests follow the steady figures, its memory limit the storm's peak with headroom.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from _procs import cpu_seconds, free_port, rss_bytes, scrape, start_trainprof, stop, wait_ready

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


@contextlib.contextmanager
def dcgm_exporter(gpus: int) -> Iterator[str]:
    """Serve `gpus` copies of the captured dcgm-exporter GPU on a loopback port; the URL."""
    from real_exporters import ScriptedExporters, gpu_labels, serve

    captured = gpu_labels()
    labels = [{**captured, "gpu": str(i), "UUID": f"GPU-{i}"} for i in range(gpus)]
    exporters = ScriptedExporters(
        {"bench": labels}, gpu_script=lambda t, uuid: {}, cpu_script=lambda t, host, cpu: (0, 0)
    )
    print(f"dcgm-exporter body: {gpus} GPUs, {len(exporters.dcgm_body('bench')):,} bytes")
    with serve(exporters) as address:
        yield f"http://{address}/dcgm/bench"


def start_dcgm_reader(port: int, dcgm_url: str) -> subprocess.Popen:
    trainprof = Path(sys.executable).parent / "trainprof"
    return subprocess.Popen(
        [
            str(trainprof),
            "exporter",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--collector.gpu.dcgm-exporter={dcgm_url}",
            "--identity.node=bench",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--scrape-interval", type=float, default=15)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--storm", type=int, default=2000)
    parser.add_argument("--dcgm-exporter", action="store_true")
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    stack = contextlib.ExitStack()
    if args.dcgm_exporter:
        proc = start_dcgm_reader(port, stack.enter_context(dcgm_exporter(args.gpus)))
    else:
        proc = start_trainprof(port, args.gpus)
    mib = 2**20
    try:
        wait_ready(url, proc)
        time.sleep(3)
        served = scrape(url)
        gpus = served.count(b"\ntrainprof_gpu_utilization_ratio{")
        if gpus != args.gpus or b'collector="gpu"' not in served:
            raise SystemExit(f"the exporter serves {gpus} GPUs, not {args.gpus}")
        c0, t0 = cpu_seconds(proc.pid), time.monotonic()
        next_scrape = t0
        while time.monotonic() - t0 < args.seconds:
            if time.monotonic() >= next_scrape:
                scrape(url)
                next_scrape += args.scrape_interval
            time.sleep(0.05)
        used, elapsed = cpu_seconds(proc.pid) - c0, time.monotonic() - t0
        print(
            f"steady ({args.gpus} GPUs, 0.5 s sampling, scrape every {args.scrape_interval:g} s, "
            f"{elapsed:.0f} s): {used / elapsed * 100:.2f} % of one core, "
            f"RSS {rss_bytes(proc.pid) / mib:.1f} MiB"
        )
        c0, t0 = cpu_seconds(proc.pid), time.monotonic()
        for _ in range(args.storm):
            scrape(url)
        used, elapsed = cpu_seconds(proc.pid) - c0, time.monotonic() - t0
        print(
            f"storm ({args.storm} scrapes back to back in {elapsed:.1f} s): "
            f"{used / args.storm * 1000:.2f} ms CPU per scrape, "
            f"{used / elapsed * 100:.0f} % of one core while it lasted"
        )
        print(
            f"rss: {rss_bytes(proc.pid) / mib:.1f} MiB now, "
            f"peak {peak_rss_bytes(proc.pid) / mib:.1f} MiB"
        )
    finally:
        stop(proc)
        stack.close()


if __name__ == "__main__":
    main()

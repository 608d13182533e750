"""What the exporter DaemonSet needs: CPU and memory with 8 fake GPUs, as the chart requests them.

    python benchmarks/exporter_footprint.py [--seconds 120] [--scrape-interval 15] [--gpus 8]

Runs the exporter (benchmarks/fake_gpu_exporter.py: the real NVML source over tests/fakes.py,
the real host collectors, sampling every 0.5 s) and reports
  steady      process CPU as % of one core while Prometheus scrapes every --scrape-interval
  storm       CPU seconds per scrape and the peak RSS (VmHWM) over 2,000 back-to-back scrapes
  rss         VmRSS at the end and the peak over the whole run
The chart's requests follow the steady figures, its memory limit the storm's peak with headroom.
"""

from __future__ import annotations

import argparse
import time

from _procs import cpu_seconds, free_port, rss_bytes, scrape, start_trainprof, stop, wait_ready


def peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--scrape-interval", type=float, default=15)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--storm", type=int, default=2000)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = start_trainprof(port, args.gpus)
    mib = 2**20
    try:
        wait_ready(url, proc)
        time.sleep(3)
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


if __name__ == "__main__":
    main()

"""The exporter's own sampling cost: 8 fake GPUs and every core, one sample every 0.5 s.

    python benchmarks/sampling_cost.py [--seconds 60] [--gpus 8]

Two numbers:
  per sample   wall time of one sample (read every source, fold it into the accumulator),
               averaged over 2,000 back-to-back samples, with each collector's share
  % of a core  process CPU while the real sampler thread runs at 0.5 s for --seconds with
               nothing scraping it (the main thread sleeps), from getrusage
The GPU readings run the real NVML source code against tests/fakes.py; a driver adds its own
time per call on real hardware.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from trainprof.contract.sampling import SampleAccumulator  # noqa: E402
from trainprof.exporter.collector import SourceRunner  # noqa: E402
from trainprof.exporter.sampler import Sampler  # noqa: E402
from trainprof.exporter.sources import default_sources  # noqa: E402
from trainprof.exporter.sources.gpu import GpuSource  # noqa: E402

from fakes import FakeNvml, h100s  # noqa: E402


def sampler(gpus: int, interval: float = 0.5) -> Sampler:
    sources = [
        GpuSource(FakeNvml(h100s(gpus, utilization=[3, 17, 45, 88, 97, 61, 12]))),
        *default_sources(["cpu", "memory", "disk", "network"]),
    ]
    return Sampler(SourceRunner(sources), SampleAccumulator(interval, {"node": "bench"}))


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()

    s = sampler(args.gpus)
    s.runner.sample()
    n = 2000
    totals: dict[str, float] = {}
    t0 = time.perf_counter()
    for _ in range(n):
        s.sample_once()
        for name, (_, seconds) in s.runner.health.items():
            totals[name] = totals.get(name, 0.0) + seconds
    per_sample = (time.perf_counter() - t0) / n
    shares = ", ".join(f"{k} {v / n * 1e6:.0f}" for k, v in totals.items())
    print(f"one sample: {per_sample * 1e6:.0f} us ({shares} us; the rest is folding it in)")
    print(f"at 0.5 s that is {per_sample / 0.5 * 100:.3f} % of a core")

    s = sampler(args.gpus)
    s.start()
    time.sleep(2)
    c0, t0 = cpu(), time.monotonic()
    time.sleep(args.seconds)
    used, elapsed = cpu() - c0, time.monotonic() - t0
    samples = s.samples
    s.stop()
    print(
        f"sampler thread over {elapsed:.0f} s ({samples} samples, {args.gpus} GPUs): "
        f"{used:.2f} CPU s = {used / elapsed * 100:.3f} % of one core"
    )


if __name__ == "__main__":
    main()

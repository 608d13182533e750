"""Run the exporter with N fake H100s (tests/fakes.py) and the real host collectors.

    python benchmarks/fake_gpu_exporter.py --port 19945 --gpus 8

The GPU readings go through the real NVML source code against the fake pynvml, so the cost
measured is the exporter's own; only the driver's time is missing (microseconds per call on
real hardware). Stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import trainprof.exporter  # noqa: E402
from trainprof.exporter.sources import default_sources  # noqa: E402
from trainprof.exporter.sources.gpu import GpuSource  # noqa: E402

from fakes import FakeNvml, h100s  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--interval", type=float, default=0.5)
    args = parser.parse_args()
    gpus = h100s(args.gpus, utilization=[3, 17, 45, 88, 97, 61, 12])
    sources = [GpuSource(FakeNvml(gpus)), *default_sources(["cpu", "memory", "disk", "network"])]
    exporter = trainprof.exporter.start(
        args.port,
        address="127.0.0.1",
        sources=sources,
        datapoint_interval=args.interval,
        identity={"node": "bench"},
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print("ready", flush=True)
    while not stop.wait(1.0):
        pass
    exporter.stop()


if __name__ == "__main__":
    main()

"""The golden scrape, and the renderer and body cache behind /metrics.

The golden files pin the exact bytes of a scrape of fake sources (two fake GPUs, one with GPM
and one without power readings; a scripted CPU; psutil on a fake /proc). Regenerate them with
`pytest tests/test_exporter_exposition.py --update-golden` and review the diff.
"""

from __future__ import annotations

import gzip
import subprocess
import threading

import psutil
import pynvml
import pytest
from prometheus_client.core import InfoMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from trainprof.contract.sampling import SampleAccumulator
from trainprof.exporter.collector import SourceRunner
from trainprof.exporter.exposition import Renderer, ScrapeBodies, wants_gzip, wants_openmetrics
from trainprof.exporter.sampler import Sampler
from trainprof.exporter.sources import default_sources, set_procfs
from trainprof.exporter.sources.gpu import GpuSource

from fakes import FakeNvml, ScriptedCpu, h100s
from procfs import Procfs

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


class Ticks:
    """A perf_counter that advances 1/1024 s per call (exact in binary), so durations are
    pinned."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 2**-10
        return self.now


def golden_sampler(tmp_path, monkeypatch) -> Sampler:
    monkeypatch.setattr(psutil, "PROCFS_PATH", psutil.PROCFS_PATH)
    proc = Procfs(tmp_path / "proc", disks={"nvme0n1": (1024, 2048), "loop0": (8, 8)})
    set_procfs(str(proc.write()))
    gpus = h100s(2, utilization=[5, 97])
    gpus[1].gpm = None
    gpus[1].utilization = [40]
    gpus[1].__post_init__()
    gpus[1].fail["nvmlDeviceGetPowerUsage"] = pynvml.NVMLError_NotSupported
    sources = [
        GpuSource(FakeNvml(gpus)),
        ScriptedCpu([([0.95, 0.2], [0.0, 0.6]), ([0.3, 0.2], [0.0, 0.0])]),
        *default_sources(["memory", "disk", "network"]),
    ]
    runner = SourceRunner(sources, clock=Ticks(), wall_clock=lambda: 1_700_000_000.0)
    accumulator = SampleAccumulator(0.5, {"training_job": "golden", "node": "n1"})
    sampler = Sampler(runner, accumulator)
    runner.sample()  # the sampler thread's priming read
    for _ in range(4):
        sampler.sample_once()
    return sampler


@pytest.mark.parametrize("openmetrics, golden", [(False, "exporter.prom"), (True, "exporter.om")])
def test_a_scrape_of_fake_sources_matches_the_golden_file(
    openmetrics, golden, root, tmp_path, monkeypatch, update_golden
):
    sampler = golden_sampler(tmp_path, monkeypatch)
    bodies = ScrapeBodies(sampler.snapshot, lambda: sampler.samples)
    body = bodies.body(openmetrics, compressed=False)
    path = root / "tests" / "golden" / golden
    if update_golden:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(body)
    assert path.exists(), f"{path} is missing; generate and review it with --update-golden"
    assert body.decode() == path.read_text(), (
        f"scrape differs from {path}; if intended, rerun with --update-golden and review the diff"
    )


def test_the_golden_scrape_passes_promtool_check_metrics(root, promtool):
    text = (root / "tests" / "golden" / "exporter.prom").read_bytes()
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()
    assert check.stdout == b"" and check.stderr == b"", "promtool lint findings"


def test_the_renderer_writes_what_prometheus_client_writes(tmp_path, monkeypatch):
    sampler = golden_sampler(tmp_path, monkeypatch)
    families = sampler.families()
    hostile = InfoMetricFamily(
        "trainprof_test", 'help with \\ and "quotes"\nand a newline', labels=["value"]
    )
    hostile.add_metric(['a"b}\n{c\\'], {"x": "1"})
    families.append(hostile)

    class Registry:
        def collect(self):
            return families

    renderer = Renderer()
    for _ in range(2):  # the second time from the prefix cache
        assert renderer.render(families, openmetrics=False) == generate_latest(Registry())
        assert renderer.render(families, openmetrics=True) == openmetrics_latest(Registry())


def test_prometheus_gets_openmetrics_and_gzip_others_get_text():
    assert wants_openmetrics(PROMETHEUS_ACCEPT)
    assert not wants_openmetrics("text/plain;version=0.0.4")
    assert not wants_openmetrics(None)
    assert not wants_openmetrics("application/openmetrics-text;q=0")
    assert wants_gzip("gzip") and wants_gzip("deflate, GZIP;q=0.5")
    assert not wants_gzip("identity") and not wants_gzip("gzip;q=0") and not wants_gzip(None)


class CountingSnapshots:
    def __init__(self, tmp_path, monkeypatch):
        self.sampler = golden_sampler(tmp_path, monkeypatch)
        self.snapshots = 0

    def snapshot(self):
        self.snapshots += 1
        return self.sampler.snapshot()


def test_each_sample_is_rendered_at_most_once_per_format(tmp_path, monkeypatch):
    counting = CountingSnapshots(tmp_path, monkeypatch)
    bodies = ScrapeBodies(counting.snapshot, lambda: counting.sampler.samples)
    first = [bodies.body(om, gz) for om in (False, True) for gz in (False, True) for _ in range(3)]
    assert counting.snapshots == 1
    assert gzip.decompress(first[3]) == first[0] and first[0] == first[1] == first[2]
    assert first[6].endswith(b"# EOF\n") and not first[0].endswith(b"# EOF\n")
    counting.sampler.sample_once()
    second = bodies.body(True, True)
    assert counting.snapshots == 2 and second != first[9]
    assert b'trainprof_samples_total{node="n1",training_job="golden"} 5.0' in gzip.decompress(
        second
    )


def test_a_scrape_does_not_wait_for_a_sample_in_progress():
    """A source stuck in NVML holds the sampler, not the scrape."""
    release = threading.Event()
    entered = threading.Event()

    class Stuck:
        name = "gpu"

        def read(self, sample):
            entered.set()
            release.wait(30)
            return True

        def close(self):
            pass

    sampler = Sampler(SourceRunner([Stuck()]), SampleAccumulator(0.5))
    bodies = ScrapeBodies(sampler.snapshot, lambda: sampler.samples)
    worker = threading.Thread(target=sampler.sample_once)
    worker.start()
    try:
        assert entered.wait(10)
        scraped = []
        scrape = threading.Thread(target=lambda: scraped.append(bodies.body(False, False)))
        scrape.start()
        scrape.join(10)
        assert scraped and b"trainprof_samples_total 0.0" in scraped[0]
    finally:
        release.set()
        worker.join()
    assert b"trainprof_samples_total 1.0" in bodies.body(False, False)

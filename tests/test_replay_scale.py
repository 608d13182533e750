"""Replay at scale keeps its verdicts: the streaming series store writes exactly what the
list-per-instant scrape wrote, so promtool sees the same input and fires the same alerts."""

from __future__ import annotations

import io
import math
import random

import pytest

from trainprof.contract.sampling import BottleneckGrid, SampleAccumulator, samples_of
from trainprof.engines.promtool import encode, series_text
from trainprof.replay import load_timeline, replay
from trainprof.replay.series_store import SeriesStore
from trainprof.replay.synthetic import write_system
from trainprof.replay.timeline import TIMESTAMP_SERIES, host_identity, scrape

START = 1_700_000_000


def _sequence(rng: random.Random, count: int) -> list[float | None]:
    """Gaps, constant runs, even steps and noise, as scraped series have them."""
    out: list[float | None] = []
    while len(out) < count:
        kind, n = rng.choice("gcsn"), rng.randint(1, 12)
        v, step = rng.choice([0.0, 1.5, 7.0, 1e6]), rng.choice([0.5, 1.0, -2.0, 0.1])
        for i in range(n):
            out.append(
                None
                if kind == "g"
                else v
                if kind == "c"
                else v + i * step
                if kind == "s"
                else rng.random()
            )
    return out[:count]


def test_the_store_encodes_exactly_as_promtool_encode_even_when_it_spills():
    rng = random.Random(7)
    for budget in (10**9, 64):  # in memory, and spilling every few values
        sequences = {f"s{i}": _sequence(rng, 300) for i in range(40)}
        store = SeriesStore(300, budget=budget)
        ids = {name: store.id_of(name, {"i": name}) for name in sequences}
        for k in range(300):
            for name, values in sequences.items():
                if values[k] is not None:
                    store.put(ids[name], k, values[k])
        got = dict(store.items())
        store.close()
        for name, values in sequences.items():
            assert got[series_text(name, {"i": name})] == encode(values), (budget, name)


def _list_scrape(timeline, scrape_interval, grid):
    """The scrape replay did before: a list as long as the job for every series."""
    t0 = timeline.start
    count = int(math.ceil((timeline.last - t0) / scrape_interval)) + 1
    series: dict[str, list] = {}
    for node, samples in sorted(timeline.hosts.items()):
        acc = SampleAccumulator(
            timeline.datapoint_interval,
            identity=host_identity(node, timeline.training_job),
            grid=grid,
        )
        i = 0
        for k in range(count):
            while i < len(samples) and samples[i].timestamp <= t0 + k * scrape_interval + 1e-9:
                acc.observe(samples[i])
                i += 1
            if acc.samples:
                for name, labels, value in samples_of(acc.families()):
                    value = value - t0 if name in TIMESTAMP_SERIES else value
                    series.setdefault(series_text(name, labels), [None] * count)[k] = value
    return series


def test_the_scraped_series_are_the_list_scrapes_value_for_value(tmp_path):
    hosts = {
        "algo-1": {
            "cores": 4,
            "gpus": 2,
            "timeline": [
                {"gpu_util": {"cycle": [0.9, 0.0, 0.5]}, "cpu": [0.97, 0.3, 0.3, 0.3]},
                {"from": 300, "gpu_util": 0.03, "gpu_mem": {"cycle": [0.2, 0.8]}},
            ],
        },
        "algo-2": {"cores": 2, "gpus": 1, "timeline": [{"gpu_util": 0.9}]},
    }
    write_system(str(tmp_path / "p"), start=START, duration=720, interval=0.5, hosts=hosts)
    timeline, _ = load_timeline(str(tmp_path / "p"), "auto", None)
    for interval in (1.0, 15.0):
        expected = {k: encode(v) for k, v in _list_scrape(timeline, interval, None).items()}
        scraped = scrape(timeline, interval, BottleneckGrid.default())
        got = dict(scraped.series.items())
        assert got == expected


def test_a_long_job_replays_the_same_alerts_at_1s_and_15s(tmp_path, promtool):
    hosts = {
        "algo-1": {
            "cores": 2,
            "gpus": 2,
            "timeline": [
                {"gpu_util": [0.03, 0.9], "cpu": [0.97, 0.3]},
                {"from": 1800, "gpu_util": 0.9, "cpu": 0.3},
            ],
        }
    }
    write_system(str(tmp_path / "p"), start=START, duration=3600, interval=0.5, hosts=hosts)
    verdicts = {}
    for interval in (1.0, 15.0):
        result = replay(str(tmp_path / "p"), None, scrape_interval=interval)
        verdicts[interval] = {
            name: [(a.labels.get("reason"), a.fired_at) for a in v.alerts]
            + [(u.labels.get("gpu"), u.first_at) for u in v.affected]
            for name, v in result.rules.items()
        }
    assert verdicts[1.0]["LowGPUUtilization"] == verdicts[15.0]["LowGPUUtilization"]
    assert verdicts[1.0]["LowGPUUtilization"] and verdicts[1.0]["CPUBottleneck"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_long_replay_shows_progress_on_a_terminal_only(tmp_path, monkeypatch):
    from trainprof.replay import timeline as timeline_module

    write_system(str(tmp_path / "p"), start=START, duration=600, interval=0.5, hosts={"algo-1": {}})
    timeline, _ = load_timeline(str(tmp_path / "p"), "auto", None)
    monkeypatch.setattr(timeline_module, "PROGRESS_FROM", 100)
    terminal = _Terminal()
    scrape(timeline, 15.0, BottleneckGrid.default(), progress=True, stream=terminal)
    shown = terminal.getvalue()
    assert "replaying [" in shown and "% of 1,200 samples and steps" in shown
    assert "100% of 1,200" in shown and shown.endswith("\r")  # the line is cleared at the end
    piped = io.StringIO()
    scrape(timeline, 15.0, BottleneckGrid.default(), progress=True, stream=piped)
    assert piped.getvalue() == ""


@pytest.mark.parametrize("budget", [10**9, 1])  # in memory; in the file from the first
def test_compact_samples_give_back_what_sagemaker_output_holds(tmp_path, budget):
    """Replay holds SageMaker samples packed, in memory and past a budget in a temporary
    file; each reads back as the sample it was."""
    from trainprof.contract.sampling import GpuSample, HostSample
    from trainprof.replay.compact import CompactSamples

    samples = CompactSamples(budget)
    original = [
        HostSample(
            START + k,
            cpu_utilization=[0.1 * k, 0.5],
            cpu_iowait=[0.0, 0.25],
            memory_used_ratio=None if k == 1 else 0.3,
            gpus=[
                GpuSample(0, "gpu0", utilization=0.9, memory_used_ratio=None),
                GpuSample(3, "gpu3", utilization=None, memory_used_ratio=0.4),
            ],
        )
        for k in (2, 0, 1)
    ]
    for sample in original:
        samples.append(sample)
    ordered = samples.in_time_order()
    assert list(ordered) == sorted(original, key=lambda s: s.timestamp)
    assert ordered.gpu_indices() == {0, 3} and list(ordered.times) == [START, START + 1, START + 2]
    assert (
        list(ordered.select(START + 1, START + 2))
        == sorted(original, key=lambda s: s.timestamp)[1:]
    )


def test_compact_samples_past_the_budget_keep_the_gpus_of_the_samples_kept():
    from trainprof.contract.sampling import GpuSample, HostSample
    from trainprof.replay.compact import CompactSamples

    samples = CompactSamples(budget=1)
    for k in range(5):
        samples.append(
            HostSample(START + k, cpu_utilization=[0.5], gpus=[GpuSample(k, f"gpu{k}", 0.9)])
        )
    assert samples.gpu_indices() == {0, 1, 2, 3, 4}
    kept = samples.select(START + 1, START + 2)
    assert kept.gpu_indices() == {1, 2} and [s.gpus[0].index for s in kept] == [1, 2]
    assert samples[-1].timestamp == START + 4

"""Replay's synthesised dcgm-exporter and node_exporter series, read back through the
committed normalisation rules by promtool.

A timeline whose values change at every sample is scraped as those exporters would have
served it; the `trainprof.sources` group then has to give back the timeline's own GPU and
CPU utilization, GPU memory ratio and GPU-to-job attribution, computed here straight from
the samples (at dcgm-exporter's collection instants for the GPU, averaged over each scrape
interval for node_exporter's counters). Wrong units (a percent read as a ratio, bytes as
MiB) or labels (`Hostname`, `UUID`, the node label) break these equalities.
"""

from __future__ import annotations

import math
import re

import pytest

from real_exporters import DCGM, NODE, read_capture
from trainprof.contract.sampling import GpuSample, HostSample
from trainprof.engines.promtool import run_rules
from trainprof.replay import cadence
from trainprof.replay.exporters import Exporters
from trainprof.replay.timeline import Timeline, scrape
from trainprof.sources import SourceOptions, adapter_groups

START = 1_700_000_000.0  # t0 is 20 s before: the minute it falls in
T0 = START - 20
JOB = "bert"
DT = 1.0  # seconds between samples
SAMPLES = 600
NODES = {"algo-1": 2, "algo-2": 2}  # GPUs per node
CORES = 3
FB = 24 * 1024**3  # bytes of framebuffer of the GPUs recorded in bytes


def _uuid(node: str, gpu: int) -> str:
    return f"GPU-{node}-{gpu}-0000-0000-000000000000"


def _gpu_util(j: int, gpu: int) -> float:
    return ((j * 7 + gpu * 31) % 101) / 100


def _gpu_mem(j: int, gpu: int) -> float:
    return ((j * 11 + gpu * 5) % 97) / 100


def _busy(j: int, core: int) -> float:
    return ((j * 13 + core * 29) % 80) / 100


def _iowait(j: int, core: int) -> float:
    return ((j * 3 + core) % 15) / 100


def _timeline(ranks: bool, recorded_uuids: bool = True) -> Timeline:
    hosts = {}
    for n, (node, gpus) in enumerate(NODES.items()):
        hosts[node] = [
            HostSample(
                START + j * DT,
                cpu_utilization=[_busy(j + n, c) for c in range(CORES)],
                cpu_iowait=[_iowait(j + n, c) for c in range(CORES)],
                memory_used_ratio=0.4,
                gpus=[
                    GpuSample(
                        g,
                        _uuid(node, g) if recorded_uuids else f"gpu{g}",
                        utilization=_gpu_util(j + n, g),
                        # algo-1 as SageMaker records it (a ratio), algo-2 as NVML (bytes)
                        memory_used_ratio=None if n else _gpu_mem(j, g),
                        memory_used_bytes=_gpu_mem(j + n, g) * FB if n else None,
                        memory_total_bytes=FB if n else None,
                    )
                    for g in range(gpus)
                ],
            )
            for j in range(1, SAMPLES + 1)
        ]
    rank_list = [("algo-1", 0), ("algo-1", 1), ("algo-2", 2), ("algo-2", 3)] if ranks else []
    return Timeline(hosts, JOB, DT, ranks=rank_list)


def _at(timeline: Timeline, node: str, t: float) -> HostSample | None:
    """The node's last sample at or before `t` seconds after t0."""
    found = None
    for s in timeline.hosts[node]:
        if s.timestamp <= T0 + t + 1e-9:
            found = s
    return found


def _between(timeline: Timeline, node: str, a: float, b: float) -> list[HostSample]:
    return [s for s in timeline.hosts[node] if T0 + a < s.timestamp <= T0 + b + 1e-9]


LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
QUERIES = {
    "gpu_util": "gpu:trainprof_gpu_utilization:ratio",
    "gpu_mem": "gpu:trainprof_gpu_memory_used:ratio",
    "gpu_bytes": "gpu:trainprof_gpu_memory_used:bytes",
    "cpu": "cpu:trainprof_cpu_utilization:ratio",
    "node_cpu": "node:trainprof_cpu_utilization:ratio",
    "job": "gpu:trainprof_gpu_job:info * on (uuid) group_left (node, gpu) "
    "group by (uuid, node, gpu) (gpu:trainprof_gpu_device:info)",
}


def _replayed(tmp_path, timeline, options, scrape_interval, collect_interval, promtool):
    sources = ("dcgm", "node_exporter")
    exporters = Exporters(sources, options, collect_interval)
    scraped = scrape(timeline, scrape_interval, exporters=exporters)
    groups = adapter_groups(sources, options)
    # From the second scrape holding data (counters need two) to the end.
    times = [
        k * scrape_interval
        for k in range(scraped.scrapes)
        if k * scrape_interval >= 20 + DT + 2 * scrape_interval
    ]
    run = run_rules(
        groups,
        scraped.series,
        scrape_interval,
        scrape_interval,
        scraped.end,
        tmp_path,
        promtool,
        queries={name: (expr, times) for name, expr in QUERIES.items()},
    )
    return times, run.queries


def _numbers(values: str) -> list[float]:
    """The values and steps written in promtool's expanding notation (`70+4x3 12x2 _`)."""
    out = []
    for token in values.split():
        if token[0] != "_":
            out += [float(x) for x in re.split(r"(?<=\d)[+-]", token.split("x")[0])]
    return out


def _by(results, *labels):
    return {tuple(lb.get(k, "") for k in labels): v for lb, v in results}


@pytest.mark.parametrize("collect", [None, 1.0, 30.0, 60.0])
def test_normalised_gpu_series_are_the_timelines_values_at_each_collection(
    tmp_path, promtool, collect
):
    timeline = _timeline(ranks=True)
    options = SourceOptions(scrape_interval=15.0)
    times, answers = _replayed(tmp_path, timeline, options, 15.0, collect, promtool)
    period = collect or 15.0
    stale = 0  # scrapes whose served value is older than the newest sample
    for t in times:
        # collections half a period out of step with the scrapes: the last at or before t
        collected_at = math.floor((t + period / 2) / period + 1e-9) * period - period / 2
        util = _by(answers["gpu_util"][t], "node", "gpu", "uuid")
        mem = _by(answers["gpu_mem"][t], "node", "gpu", "uuid")
        used = _by(answers["gpu_bytes"][t], "node", "gpu", "uuid")
        expected_keys = {(n, str(g), _uuid(n, g)) for n, gpus in NODES.items() for g in range(gpus)}
        assert set(util) == expected_keys and set(mem) == expected_keys, t
        for node, gpus in NODES.items():
            sample, newest = _at(timeline, node, collected_at), _at(timeline, node, t)
            assert sample is not None and newest is not None
            for g in range(gpus):
                key = (node, str(g), _uuid(node, g))
                want = sample.gpus[g].utilization
                # whole percent, as dcgm-exporter serves it
                assert util[key] == pytest.approx(want, abs=0.005 + 1e-9), (t, key)
                assert mem[key] == pytest.approx(sample.gpus[g].memory_ratio(), abs=1e-4)
                if sample.gpus[g].memory_used_bytes is not None:  # whole MiB
                    assert used[key] == pytest.approx(sample.gpus[g].memory_used_bytes, abs=2**20)
                stale += abs(newest.gpus[g].utilization - want) > 0.01
    # The served values are the collections', not the newest samples: the check above
    # tells them apart.
    assert stale > 0


def test_normalised_cpu_series_are_the_timelines_average_over_each_scrape(tmp_path, promtool):
    timeline = _timeline(ranks=True)
    times, answers = _replayed(tmp_path, timeline, SourceOptions(), 15.0, None, promtool)
    for t in times:
        cpu = _by(answers["cpu"][t], "node", "cpu")
        node_cpu = _by(answers["node_cpu"][t], "node")
        assert set(cpu) == {(n, str(c)) for n in NODES for c in range(CORES)}, t
        assert set(node_cpu) == {(n,) for n in NODES}
        for node in NODES:
            window = _between(timeline, node, t - 15.0, t)  # 5 samples in the last one
            assert window
            per_core = [
                sum(s.cpu_utilization[c] for s in window) / len(window) for c in range(CORES)
            ]
            for c, want in enumerate(per_core):
                # node_exporter counts in 10 ms ticks: 4 counters, 5 to 15 s apart
                assert cpu[(node, str(c))] == pytest.approx(want, abs=0.01), (t, node, c)
            assert node_cpu[(node,)] == pytest.approx(sum(per_core) / CORES, abs=0.01)


def test_cpu_counters_advance_by_the_time_that_passed_whatever_the_samples(tmp_path, promtool):
    """The rules read a core's shares as its idle and iowait rates, so its modes must add up
    to the time between two scrapes, as a kernel's do: here the recording says a sample
    lasts 0.5 s while they come every second, and a minute of it is missing. Every scrape
    still shows the average of the samples since the last scrape that saw one; a scrape in
    the gap serves nothing, so the rate falls back on the scrapes before it until they are
    out of `irate`'s reach."""
    gap = (T0 + 200.0, T0 + 260.0)
    recorded = _timeline(ranks=True)
    hosts = {
        node: [s for s in samples if not gap[0] < s.timestamp <= gap[1]]
        for node, samples in recorded.hosts.items()
    }
    timeline = Timeline(hosts, JOB, DT / 2, ranks=recorded.ranks)
    times, answers = _replayed(tmp_path, timeline, SourceOptions(), 15.0, None, promtool)
    served = [
        k * 15.0
        for k in range(int(times[-1] // 15) + 1)
        if _between(timeline, "algo-1", k * 15.0 - 15, k * 15.0)
    ]
    checked_gap = 0
    for t in times:
        cpu = _by(answers["cpu"].get(t, []), "node", "cpu")
        last = [u for u in served if u <= t][-2:]
        if len(last) < 2 or last[0] < t - 45.0:  # 2.42 ranges include their start
            assert not cpu, t  # the two scrapes irate needs are out of its reach
            checked_gap += 1
            continue
        window = _between(timeline, "algo-1", last[0], last[1])
        for c in range(CORES):
            want = sum(s.cpu_utilization[c] for s in window) / len(window)
            assert cpu[("algo-1", str(c))] == pytest.approx(want, abs=0.01), (t, c)
    assert checked_gap >= 2


def test_gpus_join_the_job_through_the_ranks_gpu_assignment(tmp_path, promtool):
    # No kube-state-metrics job label: the ranks' trainprof_gpu_assignment_info alone.
    options = SourceOptions(pod_job_label="")
    times, answers = _replayed(tmp_path, _timeline(ranks=True), options, 15.0, None, promtool)
    jobs = answers["job"][times[-1]]
    assert sorted((lb["node"], lb["gpu"], lb["uuid"], lb["training_job"]) for lb, _ in jobs) == [
        (n, str(g), _uuid(n, g), JOB) for n, gpus in NODES.items() for g in range(gpus)
    ]
    assert all("namespace" not in lb for lb, _ in jobs)  # the ranks serve none


def test_without_ranks_gpus_join_the_job_through_their_pods(tmp_path, promtool):
    # SageMaker output without framework traces: no training process, so dcgm-exporter's
    # pod labels and kube-state-metrics' kube_pod_labels; SageMaker's `gpu0` is no UUID.
    timeline = _timeline(ranks=False, recorded_uuids=False)
    times, answers = _replayed(tmp_path, timeline, SourceOptions(), 15.0, None, promtool)
    jobs = answers["job"][times[-1]]
    found = sorted((lb["node"], lb["gpu"], lb["namespace"], lb["training_job"]) for lb, _ in jobs)
    assert found == [(n, str(g), "default", JOB) for n, gpus in NODES.items() for g in range(gpus)]
    uuids = {lb["uuid"] for lb, _ in jobs}
    assert len(uuids) == 4 and all(u.startswith("GPU-") and len(u) == 40 for u in uuids)


def test_a_node_label_of_instance_still_names_the_node(tmp_path, promtool):
    options = SourceOptions(node_label="instance")
    times, answers = _replayed(tmp_path, _timeline(ranks=True), options, 15.0, None, promtool)
    assert set(_by(answers["node_cpu"][times[-1]], "node")) == {(n,) for n in NODES}


def test_synthesised_series_carry_the_real_exporters_label_names_and_units():
    timeline = _timeline(ranks=True)
    scraped = scrape(timeline, 15.0, exporters=Exporters(("dcgm", "node_exporter")))
    served: dict[str, list[tuple[dict[str, str], str]]] = {}
    for text, values in scraped.series.items():
        name, _, rest = text.partition("{")
        labels = dict(LABEL.findall(rest))
        served.setdefault(name, []).append((labels, values))
    captured_dcgm = {n: set(lb) for n, lb, _ in read_capture(DCGM)[0]}
    target = {"job", "instance"}
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"):
        assert served[name], name
        for labels, values in served[name]:
            assert set(labels) - target == captured_dcgm[name], name
            assert labels["Hostname"] in NODES and labels["device"] == f"nvidia{labels['gpu']}"
            numbers = _numbers(values)
            assert all(x == int(x) for x in numbers), (name, values[:80])  # whole % / MiB
            if name == "DCGM_FI_DEV_GPU_UTIL":
                assert max(numbers) > 1  # a percent, not a ratio
    captured_modes = {
        lb["mode"] for n, lb, _ in read_capture(NODE)[0] if n == "node_cpu_seconds_total"
    }
    for labels, _ in served["node_cpu_seconds_total"]:
        assert set(labels) == {"cpu", "mode", "job", "instance", "node"}
        assert labels["mode"] in captured_modes
    modes = {lb["mode"] for lb, _ in served["node_cpu_seconds_total"]}
    assert {"user", "system", "idle", "iowait"} <= modes
    # dcgm and node_exporter replace trainprof's exporter entirely
    assert not [n for n in served if n.startswith(("trainprof_cpu", "trainprof_gpu_util"))]
    assert served["trainprof_gpu_assignment_info"]


def test_a_slow_groups_alert_restarts_its_for_when_its_condition_stops_holding():
    groups = [
        {"name": "fast", "interval": "15s", "rules": [{"alert": "Fast", "expr": "x"}]},
        {
            "name": "slow",
            "interval": "1m",
            "rules": [{"alert": "Low", "expr": "x < 1", "for": "2m", "labels": {"rule": "L"}}],
        },
    ]
    low = {"alertname": "Low", "rule": "L", "gpu": "0"}
    # active from 15 s on, except at 120 s (a 1 m evaluation) and 135 s (between them)
    active = {t: [low] for t in range(15, 601, 15) if t not in (120, 135)}
    active[135] = []
    slow = cadence.SlowAlerts(groups, evaluation=15)
    assert slow.rule_of({"alertname": "Fast"}) is None
    assert slow.rule_of({"alertname": "Low", "rule": "other"}) is None
    firing = slow.firing(active, end=600)
    first = min(t for t, alerts in firing.items() if alerts)
    # pending again at 180 (120 found it resolved; 135 is no evaluation of the slow group)
    assert first == 300
    assert firing[315] == [{**low, "alertstate": "firing"}]  # held between evaluations

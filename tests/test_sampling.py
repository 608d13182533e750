"""The sample-to-metrics path shared by the exporter, replay and the rule tests."""

from __future__ import annotations

import math
import subprocess

from prometheus_client import CollectorRegistry, generate_latest

from trainprof.contract.sampling import (
    BottleneckGrid,
    GpuSample,
    HostSample,
    SampleAccumulator,
    js_distance,
)


def sample(t=0.5, cores=(0.2, 0.2), iowait=(0.0, 0.0), gpus=((0.9, 0.5),)):
    return HostSample(
        t,
        cpu_utilization=list(cores),
        cpu_iowait=list(iowait),
        memory_used_bytes=2e9,
        memory_total_bytes=8e9,
        gpus=[
            GpuSample(i, f"GPU-{i}", utilization=u, memory_used_ratio=m)
            for i, (u, m) in enumerate(gpus)
        ],
    )


def test_histograms_hold_every_sample_in_le_buckets():
    acc = SampleAccumulator(0.5)
    for u in (0.0, 0.05, 0.07, 1.0):
        acc.observe(sample(gpus=((u, 0.5),)))
    value = lambda le: acc.value("trainprof_gpu_utilization_sampled_ratio_bucket", le=le)
    assert (
        value("0.0"),
        value("0.05"),
        value("0.1"),
        value("0.95"),
        value("1.0"),
        value("+Inf"),
    ) == (1, 2, 3, 3, 4, 4)
    assert acc.value("trainprof_gpu_utilization_sampled_ratio_sum") == 1.12
    assert acc.value("trainprof_cpu_utilization_sampled_ratio_count") == 4


def test_the_node_histograms_pool_every_gpu_of_the_host():
    acc = SampleAccumulator(0.5)
    acc.observe(sample(gpus=((0.05, 0.5), (0.9, 0.75))))
    acc.observe(sample(gpus=((0.2, 0.5), (1.0, 0.8), (0.0, None))))
    pooled = lambda le: acc.value("trainprof_node_gpu_utilization_sampled_ratio_bucket", le=le)
    # 0.0, 0.05, 0.2, 0.9, 1.0: two at or below 0.05, three at or below 0.2, all five at 1.0
    assert (pooled("0.05"), pooled("0.2"), pooled("0.9"), pooled("1.0")) == (2, 3, 4, 5)
    assert acc.value("trainprof_node_gpu_utilization_sampled_ratio_count") == 5
    assert math.isclose(acc.value("trainprof_node_gpu_utilization_sampled_ratio_sum"), 2.15)
    # the third GPU's memory could not be read: four memory samples, not five
    assert acc.value("trainprof_node_gpu_memory_used_sampled_ratio_count") == 4
    assert acc.value("trainprof_node_gpu_memory_used_sampled_ratio_bucket", le="0.5") == 2


def test_bottlenecks_need_a_core_strictly_above_and_a_gpu_strictly_below():
    acc = SampleAccumulator(0.5)
    acc.observe(sample(cores=(0.95, 0.1), gpus=((0.05, 0.5), (0.9, 0.5))))  # counts
    acc.observe(sample(cores=(0.9, 0.1), gpus=((0.05, 0.5),)))  # 0.9 is not above
    acc.observe(sample(cores=(0.95, 0.1), gpus=((0.1, 0.5),)))  # 0.1 is not below
    acc.observe(sample(cores=(0.95,), gpus=()))  # no GPU at all
    cpu = lambda c, g: acc.value("trainprof_cpu_bottleneck_samples_total", cpu_above=c, gpu_below=g)
    assert cpu("0.9", "0.1") == 1
    assert cpu("0.8", "0.2") == 3
    assert acc.value("trainprof_samples_total") == 4


def test_io_bottlenecks_use_the_busiest_core_iowait():
    acc = SampleAccumulator(0.5)
    acc.observe(sample(iowait=(0.0, 0.6), gpus=((0.02, 0.5),)))
    assert (
        acc.value("trainprof_io_bottleneck_samples_total", iowait_above="0.5", gpu_below="0.1") == 1
    )
    assert (
        acc.value("trainprof_io_bottleneck_samples_total", iowait_above="0.7", gpu_below="0.1") == 0
    )


def test_extra_threshold_pairs_are_counted_with_canonical_labels():
    acc = SampleAccumulator(0.5, grid=BottleneckGrid.default().including(cpu=[(0.85, 0.15)]))
    acc.observe(sample(cores=(0.87, 0.1), gpus=((0.12, 0.5),)))
    assert (
        acc.value("trainprof_cpu_bottleneck_samples_total", cpu_above="0.85", gpu_below="0.15") == 1
    )


def test_unreadable_values_are_skipped_not_counted_as_zero():
    acc = SampleAccumulator(0.5)
    acc.observe(
        HostSample(
            0.5,
            cpu_utilization=[0.95],
            gpus=[
                GpuSample(0, "GPU-0", utilization=None, memory_used_ratio=None),
                GpuSample(1, "GPU-1", utilization=0.5),
            ],
        )
    )
    assert acc.value("trainprof_gpu_utilization_sampled_ratio_count", gpu="0") == 0
    assert acc.value("trainprof_gpu_utilization_ratio", gpu="0") is None
    assert (
        acc.value("trainprof_cpu_bottleneck_samples_total", cpu_above="0.9", gpu_below="0.5") == 0
    )


def test_a_lost_gpu_keeps_its_counters_but_loses_its_gauges():
    acc = SampleAccumulator(0.5)
    acc.observe(sample(gpus=((0.9, 0.5), (0.8, 0.5))))
    acc.observe(sample(gpus=((0.9, 0.5),)))
    assert acc.value("trainprof_gpu_utilization_sampled_ratio_count", gpu="1") == 1
    assert acc.value("trainprof_gpu_utilization_ratio", gpu="1") is None
    assert acc.value("trainprof_gpu_info", gpu="1") is None


def test_js_distance_matches_the_definition():
    assert js_distance([1, 0], [1, 0]) == 0
    assert math.isclose(js_distance([10, 0], [0, 10]), math.sqrt(math.log(2)))
    assert js_distance([0, 0], [1, 0]) is None
    p, q = [3, 1], [1, 3]
    pn, qn = [0.75, 0.25], [0.25, 0.75]
    m = [(a + b) / 2 for a, b in zip(pn, qn)]
    kl = lambda x: sum(a * math.log(a / b) for a, b in zip(x, m))
    assert math.isclose(js_distance(p, q), math.sqrt((kl(pn) + kl(qn)) / 2))


def test_gpus_pinned_at_100_percent_have_a_histogram_and_zero_distance():
    acc = SampleAccumulator(0.5)
    acc.observe(sample(gpus=((1.0, 0.5), (1.0, 0.5))))
    assert acc.value("trainprof_gpu_utilization_js_distance", gpu="0", peer_gpu="1") == 0


def test_exposition_passes_promtool_check_metrics(promtool):
    acc = SampleAccumulator(0.5, identity={"node": "n1", "training_job": 'we"ird\njob'})
    acc.observe(
        HostSample(
            0.5,
            cpu_utilization=[0.5, 0.7],
            cpu_iowait=[0.1, 0.0],
            memory_used_bytes=1e9,
            memory_total_bytes=4e9,
            disk={"nvme0n1": (1e6, 2e6)},
            network={"eth0": (3e6, 4e6)},
            gpus=[
                GpuSample(
                    0,
                    "GPU-a",
                    utilization=0.4,
                    memory_used_bytes=1e9,
                    memory_total_bytes=4e9,
                    power_watts=250,
                    energy_joules=1e5,
                    temperature_celsius=60,
                    sm_clock_hertz=1.4e9,
                    name="NVIDIA A100",
                    driver_version="550.54",
                ),
                GpuSample(1, "GPU-b", utilization=0.6),
            ],
        )
    )
    registry = CollectorRegistry()
    registry.register(type("C", (), {"collect": lambda self: acc.families()})())
    text = generate_latest(registry)
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert b'training_job="we\\"ird\\njob"' in text


def test_a_row_holds_the_values_of_the_families_and_a_shape_names_them():
    """Replay takes each scrape's values from row() and names them once per shape from
    families(): the two must agree at every step, whatever comes and goes."""
    import random

    from trainprof.contract.sampling import samples_of

    rng = random.Random(5)
    acc = SampleAccumulator(0.5, {"node": "n1"}, BottleneckGrid.default().including([(0.5, 0.2)]))
    names_of: dict = {}
    for t in range(400):
        n_gpus = rng.choice([0, 2, 3, 3, 3])  # GPUs appear, vanish and come back
        gpus = []
        for i in range(n_gpus):
            maybe = lambda: rng.choice([None, rng.random(), rng.random()])  # noqa: E731
            gpus.append(
                GpuSample(
                    i,
                    f"GPU-{i}" if t % 50 else f"GPU-{i}-new",
                    utilization=maybe(),
                    memory_used_bytes=rng.choice([None, 4e9]),
                    memory_total_bytes=8e9,
                    power_watts=maybe(),
                    energy_joules=rng.choice([None, float(t)]),
                    sm_active=maybe(),
                    name="H100",
                    driver_version="550",
                )
            )
        cores = [rng.random() for _ in range(rng.choice([0, 4, 4]))]
        acc.observe(
            HostSample(
                t * 0.5,
                cpu_utilization=cores,
                cpu_iowait=[rng.random() / 10 for _ in cores] if t % 3 else [],
                memory_used_bytes=rng.choice([None, 2e9]),
                memory_total_bytes=rng.choice([None, 8e9]),
                memory_used_ratio=rng.choice([None, 0.25]),
                gpus=gpus,
                disk={"sda": (t * 10.0, t * 2.0)} if t % 4 else {},
                network={"eth0": (t * 5.0, 1.0)} if t % 5 else {},
            )
        )
        shape, values = acc.row()
        rows = list(samples_of(acc.families()))
        assert values == [v for _, _, v in rows], t
        names = [(n, sorted(labels.items())) for n, labels, _ in rows]
        assert names_of.setdefault(shape, names) == names, t
    assert len(names_of) > 10  # the shapes did change


def test_served_quantiles_are_histogram_quantile_of_the_buckets():
    import itertools
    import random

    from trainprof.contract import metrics
    from trainprof.contract.quantiles import histogram_quantile
    from trainprof.contract.sampling import Histogram

    rng = random.Random(9)
    for _ in range(3000):
        h = Histogram(metrics.UTILIZATION_BUCKETS)
        for _ in range(rng.randint(0, 40)):
            h.observe(rng.choice([rng.random(), 0.0, 1.0, 0.05, 1.3 * rng.random(), -0.1]))
        buckets = list(zip(h.bounds, itertools.accumulate(h.counts))) + [(math.inf, h.count)]
        for q in (0.0, 0.25, 0.5, 0.95, 0.99, 1.0):
            want, got = histogram_quantile(q, buckets), h.quantile(q)
            assert got == want or (math.isnan(got) and math.isnan(want)), (q, h.counts)

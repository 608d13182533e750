"""The profiler rules compiled for `source: dcgm,node_exporter` (and the mixed sources), run
by promtool over dcgm-exporter and node_exporter series with the real label sets of
tests/data/real-exporters.

One job runs on the captured GPU's host with two GPUs; kube-state-metrics' `kube_pod_labels`
ties their workload pod to the job (or the ranks' `trainprof_gpu_assignment_info` does). Each
case scripts the GPUs' utilization and memory and the cores' time, and says which alerts the
compiled rules must and must not fire. The expected verdicts follow from the scripts: nothing
here imports the code that compiles the rules except to compile them.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from real_exporters import DCGM, NODE, gpu_labels, read_capture, variant
from trainprof.engines.promtool import series_text
from trainprof.generation.render import to_yaml
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config

HOST = "lke529760-766837-0a634ab30000"  # the captured GPU's Hostname
POD = {"namespace": "default", "pod": "cuda-75454ffb9f-8ljq7"}  # the captured workload
JOB = {"namespace": "default", "training_job": "bert"}
UUIDS = ("GPU-a", "GPU-b")
CORES = 4
SAMPLES = 160  # 40 minutes at the 15 s scrape
MIB = 20475  # each GPU's framebuffer, MiB (as captured: used + free + reserved)


def _constant(value: float) -> list[float]:
    return [value] * (SAMPLES + 1)


def _values(values: list[float]) -> str:
    return " ".join(f"{v:g}" for v in values)


def _dcgm(util: dict[str, list[float]], used: dict[str, list[float]], variant_name: str) -> list:
    """Both GPUs' GPU_UTIL (percent) and framebuffer (MiB) in the captured label set."""
    captured = {n: v for n, _, v in read_capture(DCGM)[0]}
    reserved = captured["DCGM_FI_DEV_FB_RESERVED"]
    series = []
    for i, uuid in enumerate(UUIDS):
        labels = variant(
            {**gpu_labels(), "UUID": uuid, "gpu": str(i), "device": f"nvidia{i}"}, variant_name
        )
        free = [MIB - reserved - u for u in used[uuid]]
        for name, values in (
            ("DCGM_FI_DEV_GPU_UTIL", util[uuid]),
            ("DCGM_FI_DEV_FB_USED", used[uuid]),
            ("DCGM_FI_DEV_FB_FREE", free),
            ("DCGM_FI_DEV_FB_RESERVED", _constant(reserved)),
        ):
            series.append({"series": series_text(name, labels), "values": _values(values)})
    return series


def _node(busy: list[float], iowait: list[float]) -> list:
    """node_exporter on HOST: core 0 busy (user) and in iowait for the given shares of each
    15 s scrape interval, the other cores idle; memory as captured."""
    series = []
    for name, labels, value in read_capture(NODE)[0]:
        if name.startswith("node_memory_") and "node" not in labels:
            series.append(
                {
                    "series": series_text(name, {**labels, "node": HOST}),
                    "values": f"{value}x{SAMPLES}",
                }
            )
    for cpu in range(CORES):
        counters = {"user": [0.0], "iowait": [0.0], "idle": [0.0], "system": [0.0]}
        for k in range(1, SAMPLES + 1):
            b, w = (busy[k], iowait[k]) if cpu == 0 else (0.0, 0.0)
            counters["user"].append(counters["user"][-1] + 15 * b)
            counters["iowait"].append(counters["iowait"][-1] + 15 * w)
            counters["idle"].append(counters["idle"][-1] + 15 * (1 - b - w))
            counters["system"].append(0.0)
        for mode, values in counters.items():
            labels = {"cpu": str(cpu), "mode": mode, "node": HOST, "instance": f"{HOST}:9100"}
            series.append(
                {"series": series_text("node_cpu_seconds_total", labels), "values": _values(values)}
            )
    return series


def _jobs(by: str) -> list:
    if by == "pod":
        labels = {**POD, "label_training_kubeflow_org_job_name": JOB["training_job"]}
        return [{"series": series_text("kube_pod_labels", labels), "values": f"1x{SAMPLES}"}]
    return [
        {
            "series": series_text(
                "trainprof_gpu_assignment_info",
                {**JOB, "rank": str(i), "node": HOST, "gpu": str(i), "uuid": uuid},
            ),
            "values": f"1x{SAMPLES}",
        }
        for i, uuid in enumerate(UUIDS)
    ]


def _promtool(tmp_path, promtool, groups: list[dict], series: list, **tests: list) -> None:
    """Check `groups` and run promtool over `series` with `tests` (alert_rule_test=...,
    promql_expr_test=...); annotations are dropped (behaviour, not wording)."""
    for group in groups:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yaml").write_text(to_yaml({"groups": groups}))
    checked = subprocess.run(
        [promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": series, **tests}],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def _run(tmp_path, promtool, rules: list[dict], source: str, series: list, checks: dict):
    """Compile `rules` for `source`, run promtool over `series`; `checks` maps an eval time
    to the alert names (with their `reason`, if any) expected firing then."""
    compiled = compile_rules(load_config({"source": source, "rules": rules}))
    groups = compiled.groups
    names = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    tests = []
    for eval_time, expected in checks.items():
        for alertname in sorted(names - {"TrainprofRuleInputMissing"}):
            fired = [e for e in expected if e[0] == alertname]
            tests.append(
                {
                    "eval_time": eval_time,
                    "alertname": alertname,
                    "exp_alerts": [_expected_alert(compiled, *e) for e in fired],
                }
            )
    # The GPU-level alerts found GPU 0, and only it (their affected recordings).
    found = [
        {
            "expr": f"count by (rule, node, gpu, uuid) ({FOUND})",
            "eval_time": eval_time,
            "exp_samples": [
                {
                    "labels": f'{{rule="{e[0].removeprefix("Training")}", node="{HOST}", '
                    f'gpu="0", uuid="{UUIDS[0]}"}}',
                    "value": 1,
                }
                for e in sorted({e[:2] for e in expected if e[1] == "gpu"})
            ],
        }
        for eval_time, expected in checks.items()
        if any(e[1] == "gpu" for e in expected)
    ]
    _promtool(tmp_path, promtool, groups, series, alert_rule_test=tests, promql_expr_test=found)
    return compiled


FOUND = '{__name__=~"gpu:trainprof_rule_.+:affected"}'  # what the GPU-level alerts found


def _expected_alert(compiled, alertname: str, level: str, extra: dict | None = None) -> dict:
    rule = next(r for r in compiled.rules if f"Training{r.name}" == alertname)
    labels = {
        "rule": rule.name,
        "severity": rule.instance.severity,
        "trainprof_rule_version": str(rule.instance.spec.version),
        **JOB,
        **(extra or {}),
    }
    return {"exp_labels": labels}  # one per job: a GPU's labels are in what it found


def _per_gpu(a: list[float], b: list[float]) -> dict[str, list[float]]:
    return dict(zip(UUIDS, (a, b)))


BUSY_GPU = _constant(95)
# The bottleneck alerts name the thresholds they count at (SageMaker's defaults).
CPU_GRID = {"cpu_above": "0.9", "gpu_below": "0.1"}
IDLE_CORES = _constant(0.0)
LOW_MEMORY = _constant(2000)
HIGH_MEMORY = _constant(18000)


@pytest.mark.parametrize("attribution", ["pod", "assignment"])
def test_low_gpu_utilization_fires_on_the_underused_gpu_only(tmp_path, promtool, attribution):
    series = (
        _dcgm(_per_gpu(_constant(30), BUSY_GPU), _per_gpu(HIGH_MEMORY, HIGH_MEMORY), "gpu_operator")
        + _node(_constant(0.5), IDLE_CORES)
        + _jobs(attribution)
    )
    reason = {"reason": "underutilized"}
    _run(
        tmp_path,
        promtool,
        [{"rule": "LowGPUUtilization"}],
        "dcgm,node_exporter",
        series,
        # below 70 % from the first evaluation on, then for: 8m20s
        {"8m": [], "20m": [("TrainingLowGPUUtilization", "gpu", reason)]},
    )


def test_a_gpu_alternating_between_busy_and_idle_fluctuates(tmp_path, promtool):
    alternating = [0.0 if k % 2 else 100.0 for k in range(SAMPLES + 1)]
    series = (
        _dcgm(_per_gpu(alternating, BUSY_GPU), _per_gpu(HIGH_MEMORY, HIGH_MEMORY), "hostname")
        + _node(_constant(0.5), IDLE_CORES)
        + _jobs("pod")
    )
    _run(
        tmp_path,
        promtool,
        [{"rule": "LowGPUUtilization"}],
        "dcgm",
        series,
        {"20m": [("TrainingLowGPUUtilization", "gpu", {"reason": "fluctuating"})]},
    )


@pytest.mark.parametrize("host_busy, fires", [(0.3, True), (0.9, False)])
def test_batch_size_needs_the_gpu_its_memory_and_the_host_all_lightly_used(
    tmp_path, promtool, host_busy, fires
):
    series = (
        _dcgm(_per_gpu(_constant(30), BUSY_GPU), _per_gpu(LOW_MEMORY, HIGH_MEMORY), "exported")
        # node_exporter's host CPU is the mean over the 4 cores: core 0 at host_busy x 4
        # would exceed 100 %, so all of core 0 is busy and the mean is 25 %; for the busy host
        # every core works.
        + _node(_constant(1.0 if host_busy < 0.5 else 0.9), IDLE_CORES)
        + _jobs("pod")
    )
    if not fires:
        series = [s for s in series if "node_cpu_seconds_total" not in s["series"]]
        series += _all_cores_busy(0.9)
    _run(
        tmp_path,
        promtool,
        [{"rule": "BatchSize"}],
        "dcgm,node_exporter",
        series,
        {"25m": [("TrainingBatchSize", "gpu")] if fires else []},
    )


def _all_cores_busy(share: float) -> list:
    series = []
    for cpu in range(CORES):
        for mode, per in (("user", share), ("idle", 1 - share), ("iowait", 0.0)):
            labels = {"cpu": str(cpu), "mode": mode, "node": HOST}
            series.append(
                {
                    "series": series_text("node_cpu_seconds_total", labels),
                    "values": f"0+{15 * per:g}x{SAMPLES}",
                }
            )
    return series


def test_gpu_memory_increase_fires_after_the_jump_and_not_before(tmp_path, promtool):
    jump = [4000.0 if k < 60 else 9000.0 for k in range(SAMPLES + 1)]  # +25 % at 15m
    series = (
        _dcgm(_per_gpu(BUSY_GPU, BUSY_GPU), _per_gpu(jump, HIGH_MEMORY), "gpu_operator")
        + _node(_constant(0.5), IDLE_CORES)
        + _jobs("pod")
    )
    _run(
        tmp_path,
        promtool,
        [{"rule": "GPUMemoryIncrease"}],
        "dcgm,node_exporter",
        series,
        {
            "14m": [],
            "16m": [("TrainingGPUMemoryIncrease", "gpu")],
            "30m": [],  # the windows hold only the new level again
        },
    )


@pytest.mark.parametrize("gpu_util, fires", [(5, True), (50, False)])
def test_cpu_bottleneck_counts_scrapes_with_a_saturated_core_and_an_idle_gpu(
    tmp_path, promtool, gpu_util, fires
):
    series = (
        _dcgm(
            _per_gpu(_constant(gpu_util), BUSY_GPU),
            _per_gpu(HIGH_MEMORY, HIGH_MEMORY),
            "gpu_operator",
        )
        + _node(_constant(0.95), IDLE_CORES)
        + _jobs("pod")
    )
    _run(
        tmp_path,
        promtool,
        [{"rule": "CPUBottleneck"}],
        "dcgm,node_exporter",
        series,
        {"25m": [("TrainingCPUBottleneck", "job", CPU_GRID)] if fires else []},
    )


def test_io_bottleneck_counts_scrapes_with_a_core_waiting_on_io(tmp_path, promtool):
    series = (
        _dcgm(_per_gpu(_constant(5), BUSY_GPU), _per_gpu(HIGH_MEMORY, HIGH_MEMORY), "old_names")
        + _node(_constant(0.2), _constant(0.6))
        + _jobs("pod")
    )
    _run(
        tmp_path,
        promtool,
        [{"rule": "IOBottleneck"}, {"rule": "CPUBottleneck"}],
        "dcgm,node_exporter",
        series,
        {"25m": [("TrainingIOBottleneck", "job", {"iowait_above": "0.5", "gpu_below": "0.1"})]},
    )


def test_cpu_bottleneck_with_gpus_from_dcgm_and_cores_from_trainprofs_exporter(tmp_path, promtool):
    """`source: dcgm`: the host's busiest core comes from trainprof's exporter gauge."""
    exporter = {"job": "trainprof", "instance": f"{HOST}:9945", "node": HOST, **JOB}
    cores = [
        {
            "series": series_text(
                "trainprof_cpu_core_utilization_ratio", {**exporter, "cpu": str(c)}
            ),
            "values": f"{0.97 if c == 0 else 0.1}x{SAMPLES}",
        }
        for c in range(CORES)
    ]
    # Served beside the per-core gauges: the busiest core, which the rule reads.
    cores.append(
        {
            "series": series_text("trainprof_cpu_busiest_core_utilization_ratio", exporter),
            "values": f"0.97x{SAMPLES}",
        }
    )
    series = (
        _dcgm(_per_gpu(_constant(2), BUSY_GPU), _per_gpu(HIGH_MEMORY, HIGH_MEMORY), "gpu_operator")
        + cores
        + _jobs("assignment")
    )
    _run(
        tmp_path,
        promtool,
        [{"rule": "CPUBottleneck"}],
        "dcgm",
        series,
        {"5m": [], "25m": [("TrainingCPUBottleneck", "job", CPU_GRID)]},
    )


def test_overall_system_usage_records_percentiles_of_the_scraped_values(tmp_path, promtool):
    series = (
        _dcgm(
            _per_gpu(_constant(25), _constant(75)),
            _per_gpu(LOW_MEMORY, HIGH_MEMORY),
            "gpu_operator",
        )
        + _node(_constant(1.0), IDLE_CORES)
        + _jobs("pod")
    )
    config = load_config(
        {"source": "dcgm,node_exporter", "rules": [{"rule": "OverallSystemUsage"}]}
    )
    record = 'node:trainprof_{}_sampled_ratio:quantile{{quantile="0.5"}}'
    node = {"node": HOST, **JOB, "quantile": "0.5"}
    tests = [
        # the node's GPUs: the mean of 25 % and 75 % at each scrape
        ("gpu_utilization", 0.5),
        # 4 cores, core 0 fully busy
        ("cpu_utilization", 0.25),
    ]
    expected = [
        {
            "expr": record.format(name),
            "eval_time": "30m",
            "exp_samples": [
                {
                    "labels": series_text(f"node:trainprof_{name}_sampled_ratio:quantile", node),
                    "value": value,
                }
            ],
        }
        for name, value in tests
    ]
    _promtool(tmp_path, promtool, compile_rules(config).groups, series, promql_expr_test=expected)


def test_load_balancing_is_left_out_with_gpus_from_dcgm_and_says_why():
    config = load_config(
        {"source": "dcgm", "rules": [{"rule": "LoadBalancing"}, {"rule": "BatchSize"}]}
    )
    compiled = compile_rules(config)
    assert [r.name for r in compiled.rules] == ["BatchSize"]
    assert any("LoadBalancing needs its GPU signals from trainprof" in w for w in compiled.warnings)
    names = [g["name"] for g in compiled.groups[:3]]
    assert names == [
        "trainprof.sources.devices",
        "trainprof.sources.inventory",
        "trainprof.sources",
    ]


def test_the_trainprof_source_compiles_exactly_as_without_the_setting():
    plain = compile_rules(load_config({"rules": [{"rule": "ProfilerReport"}]}))
    named = compile_rules(
        load_config({"source": "trainprof", "rules": [{"rule": "ProfilerReport"}]})
    )
    assert plain.groups == named.groups
    assert "trainprof.sources" not in [g["name"] for g in plain.groups]


@pytest.mark.parametrize("ranks", [False, True])
def test_node_exporter_alone_says_when_no_rank_joins_the_nodes_to_jobs(tmp_path, promtool, ranks):
    """With node_exporter and no dcgm, only the ranks' GPU assignment ties nodes to jobs."""
    series = _node(_constant(0.95), IDLE_CORES) + (_jobs("assignment") if ranks else [])
    groups = compile_rules(
        load_config({"source": "node_exporter", "rules": [{"rule": "CPUBottleneck"}]})
    ).groups
    missing = {
        "alertname": "TrainprofRuleInputMissing",
        "rule": "TrainprofHealth",
        "severity": "warning",
        "affects": "sources",
        "trainprof_rule_version": "1",
        "input": "trainprof_gpu_assignment_info",
        "scope": "cluster",
    }
    alerts = [
        {
            "eval_time": "10m",
            "alertname": "TrainprofRuleInputMissing",
            "exp_alerts": [] if ranks else [{"exp_labels": missing}],
        }
    ]
    _promtool(tmp_path, promtool, groups, series, alert_rule_test=alerts)

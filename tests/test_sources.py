"""The dcgm-exporter and node_exporter normalisation, on the real exporters' label sets.

promtool evaluates the `trainprof.sources` group over series whose names and labels come from
the captures in tests/data/real-exporters, in every label variant dcgm-exporter is known to
deliver; the expected values are computed here from the captured numbers.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from real_exporters import DCGM, NODE, gpu_labels, mig_instances, read_capture, variant
from trainprof.engines.promtool import series_text
from trainprof.generation.render import to_yaml
from trainprof.sources import SourceOptions, adapter_groups, parse_sources

HOST = "lke529760-766837-0a634ab30000"  # the captured GPU's Hostname
MODEL = "NVIDIA RTX 4000 Ada Generation"
WORKLOAD = {"namespace": "default", "pod": "cuda-75454ffb9f-8ljq7", "container": "cuda"}
# GPU_UTIL (percent) each variant's GPU reports; None: the field is not served.
UTIL = {"gpu_operator": 42, "hostname": 10, "old_names": 77, "exported": 5, "no_pod": 0}
MIG_GR_ENGINE = {"1": 0.25, "2": 0.75}


def _dcgm_series() -> list[dict]:
    """The captured GPU once per variant (each with its own UUID), the `hostname` one
    scraped a second time by another Prometheus job, a MIG GPU with two instances and no
    GPU_UTIL, and a GPU serving framebuffer fields only."""
    captured, _ = read_capture(DCGM)
    base = gpu_labels()
    devices = []
    for name, util in UTIL.items():
        labels = variant({**base, "UUID": f"GPU-{name}"}, name)
        devices.append((labels, {"DCGM_FI_DEV_GPU_UTIL": util}))
        if name == "hostname":
            twice = {**labels, "job": "dcgm-exporter-2", "instance": "10.0.0.9:9400"}
            devices.append((twice, {"DCGM_FI_DEV_GPU_UTIL": util}))
    mig_base = {**base, "UUID": "GPU-mig", "Hostname": "mig-host"}
    for labels in mig_instances(mig_base, tuple(MIG_GR_ENGINE)):
        gr = MIG_GR_ENGINE[labels["GPU_I_ID"]]
        devices.append(
            (labels, {"DCGM_FI_DEV_GPU_UTIL": None, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": gr})
        )
    bare = {**base, "UUID": "GPU-bare"}
    devices.append((bare, {"DCGM_FI_DEV_GPU_UTIL": None, "DCGM_FI_PROF_GR_ENGINE_ACTIVE": None}))
    series = []
    for labels, script in devices:
        for name, field, value in captured:
            value = script.get(name, value)
            if value is None:
                continue
            extra = {k: v for k, v in field.items() if k in ("err_code", "err_msg")}
            series.append(
                {"series": series_text(name, {**labels, **extra}), "values": f"{value}x80"}
            )
    return series


def _node_series() -> list[dict]:
    """The node_exporter capture on node HOST: cpu0 80% busy and 10% in iowait, the other
    cores idle, memory as captured. cpu0's counters are also scraped by a second job, as
    when two Prometheus jobs scrape one node_exporter: its shares must not double."""
    captured, _ = read_capture(NODE)
    series = []
    for name, labels, value in captured:
        if name == "node_cpu_seconds_total":
            step = {("0", "user"): 12, ("0", "iowait"): 1.5, ("0", "idle"): 1.5}.get(
                (labels["cpu"], labels["mode"]), 15 if labels["mode"] == "idle" else 0
            )
            values = f"{value}+{step}x80"
        elif name.startswith("node_memory_") and "node" not in labels:
            values = f"{value}x80"
        else:
            continue
        series.append({"series": series_text(name, {**labels, "node": HOST}), "values": values})
        if name == "node_cpu_seconds_total" and labels["cpu"] == "0":
            twice = {**labels, "node": HOST, "job": "node-exporter-2"}
            series.append({"series": series_text(name, twice), "values": values})
    return series


def _jobs_series() -> list[dict]:
    one = "1x80"
    return [
        # the ranks of j1 use GPU-hostname (training API) and GPU-absent, which no dcgm serves
        {
            "series": series_text(
                "trainprof_gpu_assignment_info",
                {
                    "namespace": "team-a",
                    "training_job": "j1",
                    "rank": "0",
                    "node": HOST,
                    "gpu": "0",
                    "uuid": "GPU-hostname",
                },
            ),
            "values": one,
        },
        {
            "series": series_text(
                "trainprof_gpu_assignment_info",
                {
                    "namespace": "team-a",
                    "training_job": "j1",
                    "rank": "1",
                    "node": "gone",
                    "gpu": "0",
                    "uuid": "GPU-absent",
                },
            ),
            "values": one,
        },
        # kube-state-metrics: the captured workload pod belongs to PyTorchJob j2
        {
            "series": series_text(
                "kube_pod_labels",
                {
                    **{k: WORKLOAD[k] for k in ("namespace", "pod")},
                    "label_training_kubeflow_org_job_name": "j2",
                },
            ),
            "values": one,
        },
    ]


def _device(uuid: str, workload: bool = True, **extra: str) -> dict[str, str]:
    labels = {"node": HOST, "gpu": "0", "uuid": uuid, "model": MODEL, **extra}
    return {**labels, **(WORKLOAD if workload else {})}


def _labels(name: str, labels: dict[str, str]) -> str:
    return series_text(name, labels)


def _memory_used_ratio() -> float:
    captured = {n: v for n, _, v in read_capture(DCGM)[0]}
    used, free = captured["DCGM_FI_DEV_FB_USED"], captured["DCGM_FI_DEV_FB_FREE"]
    return used / (used + free + captured["DCGM_FI_DEV_FB_RESERVED"])


def _host_memory_used_ratio() -> float:
    m = {n: v for n, lb, v in read_capture(NODE)[0] if n.startswith("node_memory_") and not lb}
    available = sum(
        m[f"node_memory_{f}_bytes"] for f in ("MemFree", "Buffers", "Cached", "SReclaimable")
    )
    return 1 - available / m["node_memory_MemTotal_bytes"]


def _per_job() -> list[dict]:
    """The rules' per-scrape gauges: one series per GPU working for a job (the GPU scraped
    twice once), in the job's labels, whichever spelling the GPU's series came in."""
    in_jobs = {
        "GPU-hostname": (HOST, "team-a", "j1", UTIL["hostname"] / 100),
        "GPU-gpu_operator": (HOST, "default", "j2", UTIL["gpu_operator"] / 100),
        "GPU-old_names": (HOST, "default", "j2", UTIL["old_names"] / 100),
        "GPU-exported": (HOST, "default", "j2", UTIL["exported"] / 100),
        "GPU-mig": ("mig-host", "default", "j2", max(MIG_GR_ENGINE.values())),
        "GPU-bare": (HOST, "default", "j2", None),
    }
    tests = []
    for metric in ("utilization", "memory_used"):
        name = f"gpu_job:trainprof_gpu_{metric}:ratio"
        samples = []
        for uuid, (node, namespace, job, util) in in_jobs.items():
            value = util if metric == "utilization" else _memory_used_ratio()
            if value is None:
                continue
            labels = {"node": node, "gpu": "0", "uuid": uuid, "namespace": namespace}
            samples.append(
                {"labels": _labels(name, {**labels, "training_job": job}), "value": value}
            )
        tests.append({"expr": name, "eval_time": "10m", "exp_samples": samples})
    return tests


def _expected() -> list[dict]:
    util = "gpu:trainprof_gpu_utilization:ratio"
    mig = {"mig_profile": "1g.5gb"}
    mig_device = {**_device("GPU-mig"), "node": "mig-host"}
    return _per_job() + [
        {
            "expr": util,
            "eval_time": "10m",
            "exp_samples": [
                {
                    "labels": _labels(util, _device(f"GPU-{name}", workload=name != "no_pod")),
                    "value": pct / 100,
                }
                for name, pct in UTIL.items()
            ]
            + [
                {"labels": _labels(util, {**mig_device, **mig, "mig_instance": i}), "value": v}
                for i, v in MIG_GR_ENGINE.items()
            ],
        },
        {
            "expr": 'gpu:trainprof_gpu_memory_used:ratio{uuid="GPU-exported"}',
            "eval_time": "10m",
            "exp_samples": [
                {
                    "labels": _labels(
                        "gpu:trainprof_gpu_memory_used:ratio", _device("GPU-exported")
                    ),
                    "value": _memory_used_ratio(),
                }
            ],
        },
        {
            # j1 through the training API's assignment (GPU-absent too: it is assigned); j2
            # through dcgm's pod labels, in all three spellings, and the MIG GPU's pod.
            "expr": "gpu:trainprof_gpu_job:info",
            "eval_time": "10m",
            "exp_samples": [
                {
                    "labels": _labels(
                        "gpu:trainprof_gpu_job:info",
                        {"uuid": u, "namespace": ns, "training_job": j},
                    ),
                    "value": 1,
                }
                for u, ns, j in (
                    ("GPU-hostname", "team-a", "j1"),
                    ("GPU-absent", "team-a", "j1"),
                    ("GPU-gpu_operator", "default", "j2"),
                    ("GPU-old_names", "default", "j2"),
                    ("GPU-exported", "default", "j2"),
                    ("GPU-mig", "default", "j2"),
                    ("GPU-bare", "default", "j2"),
                )
            ],
        },
        {
            "expr": "node:trainprof_node_job:info",
            "eval_time": "10m",
            "exp_samples": [
                {
                    "labels": _labels(
                        "node:trainprof_node_job:info",
                        {"node": n, "namespace": ns, "training_job": j},
                    ),
                    "value": 1,
                }
                for n, ns, j in (
                    (HOST, "team-a", "j1"),
                    (HOST, "default", "j2"),
                    ("mig-host", "default", "j2"),
                )
            ],
        },
        {
            "expr": 'cpu:trainprof_cpu_utilization:ratio{cpu=~"0|1"}',
            "eval_time": "10m",
            "exp_samples": [
                {
                    "labels": _labels(
                        "cpu:trainprof_cpu_utilization:ratio", {"node": HOST, "cpu": "0"}
                    ),
                    "value": 0.8,
                },
                {
                    "labels": _labels(
                        "cpu:trainprof_cpu_utilization:ratio", {"node": HOST, "cpu": "1"}
                    ),
                    "value": 0,
                },
            ],
        },
        {
            "expr": 'cpu:trainprof_cpu_iowait:ratio{cpu="0"}',
            "eval_time": "10m",
            "exp_samples": [
                {
                    "labels": _labels("cpu:trainprof_cpu_iowait:ratio", {"node": HOST, "cpu": "0"}),
                    "value": 0.1,
                }
            ],
        },
        {
            "expr": "node:trainprof_memory_used:ratio",
            "eval_time": "10m",
            "exp_samples": [
                {
                    "labels": _labels("node:trainprof_memory_used:ratio", {"node": HOST}),
                    "value": _host_memory_used_ratio(),
                }
            ],
        },
    ]


def _missing(input_series: str, scope: str, **labels: str) -> dict:
    """The alert naming a missing input, for the cluster or (with their labels) a job."""
    return {
        "exp_labels": {
            "alertname": "TrainprofRuleInputMissing",
            "rule": "TrainprofHealth",
            "severity": "warning",
            "affects": "sources",
            "trainprof_rule_version": "1",
            "input": input_series,
            "scope": scope,
            **labels,
        }
    }


MISSING = '{__name__=~".+:trainprof_health_rule_input_missing:affected"}'


def _missing_unit(input_series: str, scope: str, **labels: str) -> dict:
    """A GPU or node the job-level alert counts, as its recording holds it."""
    return {
        "labels": _labels(
            "",
            {
                "rule": "TrainprofHealth",
                "severity": "warning",
                "affects": "sources",
                "input": input_series,
                "scope": scope,
                **labels,
            },
        ),
        "value": 1,
    }


def _promtool_test(tmp_path, promtool, input_series, expr_tests, alert_tests=()):
    groups = adapter_groups(parse_sources("dcgm,node_exporter"), SourceOptions())
    for rule in (r for g in groups for r in g["rules"]):
        rule.pop("annotations", None)  # behaviour, not wording
    (tmp_path / "rules.yaml").write_text(to_yaml({"groups": groups}))
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": input_series,
                "promql_expr_test": expr_tests,
                "alert_rule_test": list(alert_tests),
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    subprocess.run(
        [promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, check=True, capture_output=True
    )
    return subprocess.run(
        [promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )


def test_dcgm_and_node_exporter_series_normalise_in_every_label_variant(tmp_path, promtool):
    series = _dcgm_series() + _node_series() + _jobs_series()
    device = _device("GPU-bare")
    # One alert per job (a device no job holds: one without job labels); the GPUs and
    # nodes each counts in its recording.
    alerts = [
        {
            "eval_time": "10m",
            "alertname": "TrainprofRuleInputMissing",
            "exp_alerts": [
                _missing("DCGM_FI_DEV_FB_USED", "gpu", namespace="team-a", training_job="j1"),
                _missing("DCGM_FI_DEV_GPU_UTIL", "gpu", namespace=device["namespace"]),
                _missing("node_cpu_seconds_total", "node", namespace="default", training_job="j2"),
                _missing(
                    "node_memory_MemAvailable_bytes", "node", namespace="default", training_job="j2"
                ),
            ],
        }
    ]
    found = {
        "expr": f"{MISSING} * 0 + 1",
        "eval_time": "10m",
        "exp_samples": [
            _missing_unit(
                "DCGM_FI_DEV_FB_USED",
                "gpu",
                uuid="GPU-absent",
                namespace="team-a",
                training_job="j1",
            ),
            _missing_unit("DCGM_FI_DEV_GPU_UTIL", "gpu", **device),
            _missing_unit(
                "node_cpu_seconds_total",
                "node",
                node="mig-host",
                namespace="default",
                training_job="j2",
            ),
            _missing_unit(
                "node_memory_MemAvailable_bytes",
                "node",
                node="mig-host",
                namespace="default",
                training_job="j2",
            ),
        ],
    }
    result = _promtool_test(tmp_path, promtool, series, [*_expected(), found], alerts)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_source_that_is_not_scraped_at_all_is_named(tmp_path, promtool):
    alerts = [
        {
            "eval_time": "10m",
            "alertname": "TrainprofRuleInputMissing",
            "exp_alerts": [
                _missing("DCGM_FI_DEV_FB_USED", "cluster"),
                _missing("node_cpu_seconds_total", "cluster"),
            ],
        }
    ]
    series = [{"series": "up", "values": "1x80"}]
    result = _promtool_test(tmp_path, promtool, series, [], alerts)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "text, message",
    [("dcgm,nvml", "unknown source 'nvml'"), (" , ", "no source named")],
)
def test_unknown_sources_are_named(text, message):
    with pytest.raises(ValueError, match=message):
        parse_sources(text)


def test_a_bad_node_label_is_refused():
    with pytest.raises(ValueError, match="not a Prometheus label name: 'kubernetes.io/host'"):
        SourceOptions(node_label="kubernetes.io/host")


def test_a_gpu_two_jobs_share_is_left_out_and_named_while_the_others_keep_their_gauges(
    tmp_path, promtool
):
    """Time-slicing: two jobs' ranks claim GPU-shared. Its series cannot be split by job, and
    joining it to both would be a many-to-many match that fails the rule for every GPU."""
    captured, _ = read_capture(DCGM)
    fields = {n: v for n, _, v in captured if n.startswith("DCGM_FI_DEV_")}
    series = []
    for uuid, gpu in (("GPU-shared", "0"), ("GPU-own", "1")):
        labels = {**gpu_labels(), "UUID": uuid, "gpu": gpu}
        series += [
            {"series": series_text(name, labels), "values": f"{value}x40"}
            for name, value in fields.items()
        ]
    for rank, (uuid, job) in enumerate(
        (("GPU-shared", "a"), ("GPU-shared", "b"), ("GPU-own", "a"))
    ):
        claim = {"namespace": "ns", "training_job": job, "uuid": uuid, "rank": str(rank)}
        series.append(
            {"series": series_text("trainprof_gpu_assignment_info", claim), "values": "1x40"}
        )
    groups = adapter_groups(("dcgm",), SourceOptions())
    (tmp_path / "rules.yaml").write_text(to_yaml({"groups": groups}))
    util = "gpu_job:trainprof_gpu_utilization:ratio"
    own = {"node": HOST, "gpu": "1", "uuid": "GPU-own", "namespace": "ns", "training_job": "a"}
    shared = [
        {
            **_missing("DCGM_FI_DEV_GPU_UTIL", "shared_gpu", namespace="ns", training_job=job),
            "exp_annotations": {
                "summary": "GPUs work for more than one job: their dcgm-exporter series are "
                "left out.",
                "description": f"Job {job}: 1 GPUs work for this job and at least one other: "
                "dcgm-exporter's series of a shared GPU cannot be told apart by job, so they "
                "are left out of every job's GPU rules while they are shared. Among them: "
                "GPU-shared.",
            },
        }
        for job in ("a", "b")
    ]
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": series,
                "promql_expr_test": [
                    {
                        "expr": util,
                        "eval_time": "9m",
                        "exp_samples": [
                            {
                                "labels": _labels(util, own),
                                "value": fields["DCGM_FI_DEV_GPU_UTIL"] / 100,
                            }
                        ],
                    }
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "9m",
                        "alertname": "TrainprofRuleInputMissing",
                        "exp_alerts": shared,
                    }
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr

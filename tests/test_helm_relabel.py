"""The chart's relabelling, applied by a real Prometheus to real training ranks.

The PodMonitor and ServiceMonitor that `helm template` renders are translated one to one into
`relabel_configs` (trainprof.deploy.relabel.to_prometheus) and given to a real Prometheus whose
`file_sd` targets carry the `__meta_kubernetes_pod_*` labels Kubernetes SD would give the
pods of a PyTorchJob, a JobSet and a Volcano job. The targets are real ranks (the training
API, run as inside a pod: KUBERNETES_SERVICE_HOST set) and a real exporter on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import trainprof.exporter
from trainprof.deploy import relabel
from trainprof.engines.localstack import prometheus, stop_process
from trainprof.exporter.sources.gpu import GpuSource

from fakes import GIB, FakeGpu, FakeNvml
from helm_render import by_kind, helm_env, objects, render
from servers import get_json, query, wait_for_targets

HERE = Path(__file__).resolve().parent
KUBERNETES_ENV = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}


def _pod(namespace: str, node: str, name: str, port_name: str, labels=None, annotations=None):
    meta = {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_node_name": node,
        "__meta_kubernetes_pod_name": name,
        "__meta_kubernetes_pod_container_port_name": port_name,
        "__meta_kubernetes_pod_label_trainprof_io_scrape": "true",
    }
    meta.update({relabel.pod_label(k): v for k, v in (labels or {}).items()})
    meta.update({relabel.pod_annotation(k): v for k, v in (annotations or {}).items()})
    return meta


# (pod meta labels, the rank's own environment, what the stored series must carry)
PODS = {
    "pytorchjob": (
        _pod(
            "team-a",
            "gpu-node-1",
            "bert-worker-0",
            "trainprof",
            {
                "training.kubeflow.org/job-name": "bert",
                "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/replica-index": "0",
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
            },
        ),
        {"RANK": "1"},  # the training operator sets RANK (master 0, worker i+1)
        {"training_job": "bert", "rank": "1", "namespace": "team-a", "node": "gpu-node-1"},
    ),
    "jobset": (
        _pod(
            "team-b",
            "gpu-node-2",
            "llama-workers-0-2-x7k",
            "trainprof",
            {
                "jobset.sigs.k8s.io/jobset-name": "llama",
                "jobset.sigs.k8s.io/replicatedjob-name": "workers",
                "batch.kubernetes.io/job-name": "llama-workers-0",
                "batch.kubernetes.io/job-completion-index": "2",
            },
        ),
        {},  # no RANK: the pod's completion index becomes the rank
        {"training_job": "llama", "rank": "2", "namespace": "team-b", "node": "gpu-node-2"},
    ),
    "volcano": (
        _pod(
            "team-c",
            "gpu-node-3",
            "gpt-worker-3",
            "trainprof",
            {"volcano.sh/job-name": "gpt"},
            {"volcano.sh/task-index": "3"},
        ),
        {},
        {"training_job": "gpt", "rank": "3", "namespace": "team-c", "node": "gpu-node-3"},
    ),
}


def _start_rank(env: dict[str, str], gpus: str | None = None) -> tuple[subprocess.Popen, int]:
    args = [sys.executable, str(HERE / "live_rank.py"), "-", "-", "-", "0"]
    if gpus:
        args.append(gpus)
    full_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "TRAINPROF_JOB")}
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, text=True, env={**full_env, **KUBERNETES_ENV, **env}
    )
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        stop_process(proc)
        raise RuntimeError(f"rank did not start: {line!r}")
    return proc, int(line)


def _chart_relabelings(helm: str, env: dict) -> dict[str, list]:
    docs = objects(render(helm, env))
    (pm,) = by_kind(docs, "PodMonitor")
    (sm,) = by_kind(docs, "ServiceMonitor")
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    (sm_endpoint,) = sm["spec"]["endpoints"]
    return {
        "ranks": endpoint["relabelings"],
        "ranks_metric": endpoint["metricRelabelings"],
        "exporter": sm_endpoint["relabelings"],
    }


@pytest.fixture(scope="module")
def chart_relabelings(helm, tmp_path_factory):
    return _chart_relabelings(helm, helm_env(tmp_path_factory.mktemp("helm")))


def test_translation_is_one_to_one(chart_relabelings):
    for name, steps in chart_relabelings.items():
        translated = relabel.to_prometheus(steps)
        assert len(translated) == len(steps), name
        for before, after in zip(steps, translated):
            assert after.get("source_labels") == before.get("sourceLabels")
            assert after.get("target_label") == before.get("targetLabel")
            assert after.get("regex") == before.get("regex")
            assert after.get("replacement") == before.get("replacement")
            assert after.get("action") == (before.get("action") or "").lower() or (
                "action" not in before and "action" not in after
            )


def test_translation_refuses_what_it_cannot_carry():
    with pytest.raises(ValueError, match="targetLabels"):
        relabel.to_prometheus([{"sourceLabels": ["a"], "targetLabels": "b"}])


def test_plain_prometheus_configuration_is_the_same_relabelling(chart_relabelings, root):
    doc = yaml.safe_load((root / "docs" / "scrape" / "kubernetes.yml").read_text())
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    ranks = jobs["trainprof-ranks"]
    # After its own pod selection (the PodMonitor's selector), the same steps.
    assert ranks["relabel_configs"][1:] == relabel.to_prometheus(chart_relabelings["ranks"])
    assert ranks["metric_relabel_configs"] == relabel.to_prometheus(
        chart_relabelings["ranks_metric"]
    )
    exporter = jobs["trainprof-exporter"]
    assert exporter["relabel_configs"][3:] == relabel.to_prometheus(chart_relabelings["exporter"])


def test_promtool_accepts_the_plain_prometheus_configuration(promtool, root, tmp_path):
    # Debian builds Prometheus without Kubernetes SD ("field kubernetes_sd_configs not
    # found"), so the discovery is swapped for file_sd; every relabelling step is checked.
    doc = yaml.safe_load((root / "docs" / "scrape" / "kubernetes.yml").read_text())
    for job in doc["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        job["file_sd_configs"] = [{"files": [str(tmp_path / "targets.json")]}]
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump(doc))
    result = subprocess.run(
        [promtool, "check", "config", "--syntax-only", str(config)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def kubernetes_like_scrape(chart_relabelings, prometheus_bin, tmp_path_factory):
    """A real Prometheus scraping three ranks and an exporter through file_sd targets that
    carry Kubernetes SD's meta labels, with the chart's relabelling."""
    workdir = tmp_path_factory.mktemp("relabel")
    procs = []
    exporter = None
    try:
        targets = []
        for kind, (meta, env, _) in PODS.items():
            gpus = "0=GPU-n1-0" if kind == "pytorchjob" else None
            proc, port = _start_rank(env, gpus)
            procs.append(proc)
            targets.append({"targets": [f"127.0.0.1:{port}"], "labels": meta})
        # The same rank's pod also declares a port that is not a rank's: dropped by the keep.
        decoy = dict(PODS["pytorchjob"][0], __meta_kubernetes_pod_container_port_name="http")
        targets.append({"targets": [targets[0]["targets"][0]], "labels": decoy})
        gpus = [
            FakeGpu("GPU-n1-0", utilization=[3], memory_used=4 * GIB, memory_total=16 * GIB),
            FakeGpu("GPU-n1-1", utilization=[2], memory_used=1 * GIB, memory_total=16 * GIB),
        ]
        exporter = trainprof.exporter.start(
            0, address="127.0.0.1", sources=[GpuSource(FakeNvml(gpus))], identity={}
        )
        exporter_target = {
            "targets": [f"127.0.0.1:{exporter.port}"],
            "labels": {
                "__meta_kubernetes_pod_node_name": "gpu-node-1",
                "__meta_kubernetes_namespace": "monitoring",
            },
        }
        (workdir / "ranks.json").write_text(json.dumps(targets))
        (workdir / "exporter.json").write_text(json.dumps([exporter_target]))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yaml"],
            "scrape_configs": [
                {
                    "job_name": "trainprof-ranks",
                    "file_sd_configs": [{"files": [str(workdir / "ranks.json")]}],
                    "relabel_configs": relabel.to_prometheus(chart_relabelings["ranks"]),
                    "metric_relabel_configs": relabel.to_prometheus(
                        chart_relabelings["ranks_metric"]
                    ),
                },
                {
                    "job_name": "trainprof-exporter",
                    "file_sd_configs": [{"files": [str(workdir / "exporter.json")]}],
                    "relabel_configs": relabel.to_prometheus(chart_relabelings["exporter"]),
                },
            ],
        }
        rules = {"rules.yaml": yaml.safe_dump({"groups": _fast_chart_rules()})}
        with prometheus(prometheus_bin, workdir, yaml.safe_dump(config), rules) as base:
            wait_for_targets(base, 4)
            yield base
    finally:
        for proc in procs:
            stop_process(proc)
            proc.stdout.close()
        if exporter is not None:
            exporter.stop()


def _fast_chart_rules() -> list[dict]:
    """LowGPUUtilization as the chart compiles it (GPU alerts joined to the GPU's job), at a
    speed a test can wait for: 1 s scrapes and evaluations, a 5 s window, 2 s of patience."""
    from trainprof.deploy.chart import chart_config
    from trainprof.rules.compiler import compile_rules
    from trainprof.rules.config import load_config

    config = load_config(
        {
            "scrape_interval": "1s",
            "rules": [
                {
                    "rule": "LowGPUUtilization",
                    "parameters": {"window": 10, "patience": 4, "scan_interval_us": 1_000_000},
                }
            ],
        }
    )
    return compile_rules(chart_config(config)).groups


def _series(base: str, expr: str, want: int, timeout: float = 20.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        result = query(base, expr)["data"]["result"]
        if len(result) >= want or time.monotonic() > deadline:
            return [r["metric"] for r in result]
        time.sleep(0.3)


def test_ranks_carry_job_identity_once_each(kubernetes_like_scrape):
    base = kubernetes_like_scrape
    series = _series(base, 'trainprof_training_steps_total{mode="train"}', len(PODS))
    assert len(series) == len(PODS), series
    seen = {}
    for labels in series:
        assert not [k for k in labels if k.startswith("exported_")], labels
        assert relabel.POD_INDEX not in labels, labels
        seen[labels["training_job"]] = {
            k: labels[k] for k in ("training_job", "rank", "namespace", "node")
        }
    assert sorted(seen.values(), key=lambda d: d["training_job"]) == sorted(
        (want for _, _, want in PODS.values()), key=lambda d: d["training_job"]
    )


def test_only_the_ranks_ports_are_scraped(kubernetes_like_scrape):
    ups = _series(kubernetes_like_scrape, 'up{job="trainprof-ranks"}', len(PODS))
    assert len(ups) == len(PODS), ups


def test_exporter_series_carry_the_node_and_no_job(kubernetes_like_scrape):
    series = _series(kubernetes_like_scrape, "trainprof_gpu_utilization_ratio", 2)
    assert {s["uuid"] for s in series} == {"GPU-n1-0", "GPU-n1-1"}
    for labels in series:
        assert labels["node"] == "gpu-node-1"
        assert "training_job" not in labels
        assert not [k for k in labels if k.startswith("exported_")], labels


def test_the_rank_reports_its_gpu_with_its_identity(kubernetes_like_scrape):
    (labels,) = _series(kubernetes_like_scrape, "trainprof_gpu_assignment_info", 1)
    assert labels["uuid"] == "GPU-n1-0"
    assert (labels["training_job"], labels["namespace"], labels["node"]) == (
        "bert",
        "team-a",
        "gpu-node-1",
    )


def test_the_compiled_rules_attribute_the_starved_gpu_to_its_job(kubernetes_like_scrape):
    base = kubernetes_like_scrape
    deadline = time.monotonic() + 60
    while True:
        alerts = get_json(f"{base}/api/v1/alerts")["data"]["alerts"]
        firing = [a["labels"] for a in alerts if a["state"] == "firing"]
        if firing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    time.sleep(3)  # a few more evaluations: the unassigned GPU must still be quiet
    alerts = get_json(f"{base}/api/v1/alerts")["data"]["alerts"]
    low = [a["labels"] for a in alerts if a["labels"]["alertname"] == "TrainingLowGPUUtilization"]
    # one alert for the job; the GPU it found, attributed to the job, in its recording
    assert [(a["training_job"], a["namespace"]) for a in low] == [("bert", "team-a")], low
    found = [
        r["metric"]
        for r in get_json(
            f"{base}/api/v1/query?query=gpu:trainprof_rule_low_gpu_utilization:affected"
        )["data"]["result"]
    ]
    assert [(a["uuid"], a["training_job"], a["namespace"], a["node"]) for a in found] == [
        ("GPU-n1-0", "bert", "team-a", "gpu-node-1")
    ], found
    assert not [k for a in low + found for k in a if k.startswith("exported_")]


def _gpu_queries(dashboard: dict) -> list[tuple[str, str]]:
    from trainprof.dashboards import panel_queries

    return [
        (title, expr)
        for title, _, expr in panel_queries(dashboard)
        if "trainprof_gpu_utilization_sampled_ratio_bucket" in expr and ":" not in expr
    ]


def test_the_charts_job_dashboard_shows_the_jobs_gpus(kubernetes_like_scrape, helm, tmp_path):
    from trainprof.dashboards.queries import interpolate

    docs = objects(render(helm, helm_env(tmp_path)))
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "trainprof-job.json" in d.get("data", {})]
    queries = _gpu_queries(json.loads(cm["data"]["trainprof-job.json"]))
    assert queries
    values = {"namespace": "team-a", "training_job": "bert", "node": None, "gpu": None}
    builtins = {"__rate_interval": "4s", "__range": "1m", "__interval": "1s"}
    deadline = time.monotonic() + 30
    for title, expr in queries:
        text = interpolate(expr, values, builtins)
        while True:
            result = query(kubernetes_like_scrape, text)["data"]["result"]
            if result or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert result, f"{title}: {text}"
        assert {r["metric"].get("node") for r in result} == {"gpu-node-1"}, title


def test_the_charts_job_dashboard_variables_follow_the_job(kubernetes_like_scrape, helm, tmp_path):
    import re

    docs = objects(render(helm, helm_env(tmp_path)))
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "trainprof-job.json" in d.get("data", {})]
    variables = {
        v["name"]: v for v in json.loads(cm["data"]["trainprof-job.json"])["templating"]["list"]
    }
    # "All" nodes is the job's nodes, not every node the DaemonSet covers.
    assert variables["node"]["includeAll"] and not variables["node"].get("allValue")
    query_text = variables["gpu"]["query"]
    query_text = query_text["query"] if isinstance(query_text, dict) else query_text
    series = re.match(r"label_values\((.*), gpu\)$", query_text).group(1)
    series = series.replace("$training_job", "bert").replace("$namespace", "team-a")
    series = series.replace("$node", "gpu-node-1")
    result = query(kubernetes_like_scrape, series)["data"]["result"]
    assert [(r["metric"]["gpu"], r["metric"]["uuid"]) for r in result] == [("0", "GPU-n1-0")]

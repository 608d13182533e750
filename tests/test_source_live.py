"""A cluster with only dcgm-exporter, node_exporter and kube-state-metrics: a real Prometheus
scrapes the captured bodies (values scripted over time), evaluates the rules compiled for
`source: dcgm,node_exporter`, and the report reads its verdicts and usage back.

Job `bert` runs on h1 and h2. h1's GPU idles at 5 % while one of its cores is saturated; h2's
GPU works at 90 % with idle cores. So LowGPUUtilization fires for h1's GPU only, and half of
the job's scrapes are CPU bottlenecks (the rule fires above 40 %).
"""

from __future__ import annotations

import contextlib
import json

from real_exporters import ScriptedExporters, gpu_labels, serve, variant
from trainprof.dashboards import fleet, job, panel_queries
from trainprof.dashboards.panels import grafanalib_json, modernize
from trainprof.dashboards.queries import interpolate
from trainprof.engines.localstack import prometheus, victoria_metrics, vmalert
from trainprof.generation.render import to_yaml
from trainprof.report import build, from_prometheus
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config

from servers import query, try_query, wait_for, wait_for_firing, webhook_sink

CONFIG = {
    "scrape_interval": "1s",
    "source": "dcgm,node_exporter",
    "source_options": {"node_label": "node"},
    "rules": [
        {
            "rule": "LowGPUUtilization",
            "parameters": {"window": 10, "patience": 4, "scan_interval_us": 1_000_000},
        },
        {
            "rule": "CPUBottleneck",
            "parameters": {"threshold": 40, "patience": 4, "scan_interval_us": 1_000_000},
        },
        {"rule": "OverallSystemUsage", "parameters": {"scan_interval_us": 1_000_000}},
    ],
}
PODS = {"h1": "bert-worker-0", "h2": "bert-worker-1"}
BUILTINS = {"__rate_interval": "4s", "__range": "1m", "__interval": "1s"}


def _exporters() -> ScriptedExporters:
    gpus = {
        host: [
            variant(
                {**gpu_labels(), "UUID": f"GPU-{host}", "Hostname": host, "pod": pod},
                "gpu_operator",
            )
        ]
        for host, pod in PODS.items()
    }

    def gpu_script(t: float, uuid: str) -> dict:
        return {"DCGM_FI_DEV_GPU_UTIL": 5 if uuid == "GPU-h1" else 90}

    def cpu_script(t: float, host: str, cpu: str) -> tuple[float, float]:
        return (0.97, 0.0) if (host, cpu) == ("h1", "0") else (0.0, 0.0)

    namespace = gpu_labels()["namespace"]
    pod_jobs = {(namespace, pod): "bert" for pod in PODS.values()}
    return ScriptedExporters(gpus, gpu_script, cpu_script, pod_jobs=pod_jobs)


def _scrape_configs(address: str) -> str:
    lines = ["scrape_configs:"]
    for kind in ("dcgm", "node"):
        lines.append(f"- job_name: {kind}\n  static_configs:")
        for host in PODS:
            node = f", node: {host}" if kind == "node" else ""
            lines.append(
                f"  - targets: ['{address}']\n"
                f"    labels: {{__metrics_path__: /{kind}/{host}{node}}}"
            )
    lines.append(
        f"- job_name: kube-state-metrics\n  honor_labels: true\n  static_configs:\n"
        f"  - targets: ['{address}']\n    labels: {{__metrics_path__: /ksm/all}}"
    )
    return "\n".join(lines) + "\n"


def _rules() -> tuple[object, str]:
    config = load_config(CONFIG)
    return config, to_yaml({"groups": compile_rules(config).groups})


def test_prometheus_fires_the_rules_compiled_for_dcgm_and_node_exporter(prometheus_bin, tmp_path):
    config, rules = _rules()
    with serve(_exporters()) as address:
        prom = (
            "global: {scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}\n"
            + _scrape_configs(address)
            + "rule_files: [rules.yaml]\n"
        )
        with prometheus(prometheus_bin, tmp_path, prom, {"rules.yaml": rules}) as base:
            wait_for_firing(base, {"LowGPUUtilization", "CPUBottleneck"}, timeout=90)
            low = [
                r["metric"]
                for r in query(base, 'ALERTS{alertstate="firing", rule="LowGPUUtilization"}')[
                    "data"
                ]["result"]
            ]
            assert [(a.get("uuid"), a["training_job"]) for a in low] == [(None, "bert")]
            found = [
                r["metric"]
                for r in query(base, "gpu:trainprof_rule_low_gpu_utilization:affected")["data"][
                    "result"
                ]
            ]
            assert [(a["node"], a["uuid"], a["training_job"]) for a in found] == [
                ("h1", "GPU-h1", "bert")
            ]
            collected = from_prometheus(base, "bert", config)
            for name in ("LowGPUUtilization", "CPUBottleneck"):
                verdict = collected.verdicts[name]
                assert verdict.fired and verdict.status.status == "fired", (name, verdict)
                assert verdict.status.datapoints, name  # the scrapes it judged
            report = build(collected)
            usage = next(
                t
                for s in report.sections
                for t in s.tables
                if t.caption.startswith("Overall system usage")
            )
            rows = {(r[0], r[1]): r[2:] for r in usage.rows}
            assert {("h1", "GPU utilization"), ("h2", "GPU utilization")} <= set(rows)
            assert {("h1", "CPU utilization"), ("h2", "CPU utilization")} <= set(rows)
            # h1's GPU: every scrape at 5 %, h2's at 90 % (min column)
            assert rows[("h1", "GPU utilization")][0].startswith("5")
            assert rows[("h2", "GPU utilization")][0].startswith("90")
            # The dashboards draw every rule of ProfilerReport; those loaded here show data.
            report_config = load_config({**CONFIG, "rules": [{"rule": "ProfilerReport"}]})
            _dashboards_read_the_adapters(base, report_config)


def _dashboards_read_the_adapters(base: str, config) -> None:
    """Every panel query of both dashboards compiled for the source is valid PromQL, and
    the panels drawing the GPU and host signals show the job's data (the training API's
    panels stay empty: no rank runs here)."""
    values = {"namespace": None, "training_job": "bert", "node": None, "gpu": None, "rank": None}
    returned = {}
    for module in (job, fleet):
        for title, ref, expr in panel_queries(modernize(grafanalib_json(module.dashboard(config)))):
            result, error = try_query(base, interpolate(expr, values, BUILTINS))
            assert error is None, f"{title} [{ref}]: {error}\n{expr}"
            returned[title] = returned.get(title, False) or bool(result)
    drawn = [
        t
        for t in returned
        if "GPU utilization" in t or "CPU core" in t or t in ("GPUs", "Running jobs")
    ]
    assert len(drawn) >= 5, sorted(returned)
    assert all(returned[t] for t in drawn), sorted(t for t in drawn if not returned[t])


def test_vmalert_fires_the_same_alerts(victoria_metrics_bin, vmalert_bin, tmp_path):
    _, rules = _rules()
    with contextlib.ExitStack() as stack:
        address = stack.enter_context(serve(_exporters()))
        scrape = "global: {scrape_interval: 1s}\n" + _scrape_configs(address)
        vm = stack.enter_context(victoria_metrics(victoria_metrics_bin, tmp_path, scrape))
        notifier, received = stack.enter_context(webhook_sink())
        stack.enter_context(
            vmalert(vmalert_bin, tmp_path, {"rules.yaml": rules}, vm, notifier, "1s")
        )

        def fired() -> set[tuple]:
            alerts = [a for d in list(received) for a in json.loads(d.body)]
            return {
                (a["labels"].get("rule"), a["labels"].get("uuid"))
                for a in alerts
                if a["labels"].get("rule") in ("LowGPUUtilization", "CPUBottleneck")
            }

        def found() -> set[str]:
            result, _ = try_query(vm, "gpu:trainprof_rule_low_gpu_utilization:affected")
            return {r["metric"].get("uuid") for r in result or []}

        # one alert for the job; the GPU it found in its recording, which vmalert writes
        wait_for(
            lambda: {("LowGPUUtilization", None), ("CPUBottleneck", None)} <= fired(),
            120,
            "vmalert to fire LowGPUUtilization and CPUBottleneck",
        )
        wait_for(lambda: "GPU-h1" in found(), 30, "vmalert to record the idle GPU")
        assert "GPU-h2" not in found()
        description = next(
            a["annotations"]["description"]
            for d in list(received)
            for a in json.loads(d.body)
            if a["labels"].get("rule") == "LowGPUUtilization"
        )
        assert description.startswith("Job bert: 1 of 2 GPUs were underutilized"), description

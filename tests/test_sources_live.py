"""A real Prometheus, and VictoriaMetrics with vmalert, scrape the captured dcgm-exporter and
node_exporter bodies (values scripted over time) and evaluate the source normalisation.

Host h1's dcgm-exporter is scraped with the exporter's own `pod`/`namespace` as target labels,
so the engine itself renames the captured workload labels to `exported_*`; host h2 serves the
newest exporter's `hostname`. Both engines must record the scripted values under the
workload's labels.
"""

from __future__ import annotations

import contextlib
import threading

from real_exporters import ScriptedExporters, gpu_labels, serve, variant
from trainprof.engines.localstack import prometheus, victoria_metrics, vmalert
from trainprof.generation.render import to_yaml
from trainprof.sources import SourceOptions, adapter_groups

from servers import query, wait_for, webhook_sink


def _exporters(switched: threading.Event) -> ScriptedExporters:
    """h1's GPU at 20 % and h2's at 80 % until `switched` is set, then the other way round."""
    base = gpu_labels()
    gpus = {
        "h1": [variant({**base, "UUID": "GPU-a", "Hostname": "h1"}, "gpu_operator")],
        "h2": [variant({**base, "UUID": "GPU-b", "Hostname": "h2"}, "hostname")],
    }

    def gpu_script(t: float, uuid: str) -> dict:
        util = 80 if switched.is_set() else 20
        return {"DCGM_FI_DEV_GPU_UTIL": util if uuid == "GPU-a" else 100 - util}

    def cpu_script(t: float, host: str, cpu: str) -> tuple[float, float]:
        return (0.75, 0.05) if (host, cpu) == ("h1", "0") else (0.0, 0.0)

    return ScriptedExporters(gpus, gpu_script, cpu_script)


def _scrape_config(address: str) -> str:
    exporter_pod = "{pod: nvidia-dcgm-exporter-x7k2p, namespace: gpu-operator}"
    return (
        "global: {scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "- job_name: dcgm\n  static_configs:\n"
        f"  - targets: ['{address}']\n"
        f"    labels: {{__metrics_path__: /dcgm/h1, {exporter_pod[1:-1]}}}\n"
        f"  - targets: ['{address}']\n    labels: {{__metrics_path__: /dcgm/h2}}\n"
        "- job_name: node\n  static_configs:\n"
        f"  - targets: ['{address}']\n    labels: {{__metrics_path__: /node/h1, node: h1}}\n"
        f"  - targets: ['{address}']\n    labels: {{__metrics_path__: /node/h2, node: h2}}\n"
    )


def _rules() -> str:
    options = SourceOptions(scrape_interval=1)
    return to_yaml({"groups": adapter_groups(("dcgm", "node_exporter"), options)})


def _values(base: str, expr: str) -> dict[tuple, float]:
    out = {}
    for r in query(base, expr)["data"]["result"]:
        labels = {k: v for k, v in r["metric"].items() if k != "__name__"}
        out[tuple(sorted(labels.items()))] = float(r["value"][1])
    return out


WORKLOAD = (("container", "cuda"), ("namespace", "default"), ("pod", "cuda-75454ffb9f-8ljq7"))


def _device(node: str, uuid: str) -> tuple:
    labels = dict(WORKLOAD)
    labels.update(
        {"gpu": "0", "model": "NVIDIA RTX 4000 Ada Generation", "node": node, "uuid": uuid}
    )
    return tuple(sorted(labels.items()))


def _check(base: str, switched: threading.Event) -> None:
    """The engine at `base` recorded the scripted values under the workload's labels, before
    and after the script switched them."""
    util = "gpu:trainprof_gpu_utilization:ratio"
    before = {_device("h1", "GPU-a"): 0.2, _device("h2", "GPU-b"): 0.8}
    wait_for(lambda: _values(base, util) == before, 90, f"{util} == {before}")
    switched.set()
    after = {_device("h1", "GPU-a"): 0.8, _device("h2", "GPU-b"): 0.2}
    wait_for(lambda: _values(base, util) == after, 90, f"{util} == {after}")
    cpu = 'cpu:trainprof_cpu_utilization:ratio{cpu="0"}'
    both = {(("cpu", "0"), ("node", "h1")), (("cpu", "0"), ("node", "h2"))}
    # A node's rate needs two scrapes: wait for both nodes, not for the first one recorded.
    wait_for(lambda: set(_values(base, cpu)) == both, 30, f"{cpu} for h1 and h2")
    busy = _values(base, cpu)
    assert set(busy) == both
    assert abs(busy[(("cpu", "0"), ("node", "h1"))] - 0.8) < 0.06  # busy + iowait's 0.05 out
    assert busy[(("cpu", "0"), ("node", "h2"))] < 0.01
    # A chained recording: vmalert reads its input back from VictoriaMetrics, where a new
    # series can take about 30 s to become searchable.
    memory = "node:trainprof_memory_used:ratio"
    nodes = {(("node", "h1"),), (("node", "h2"),)}
    wait_for(lambda: set(_values(base, memory)) == nodes, 90, f"{memory} for h1 and h2")


def test_prometheus_scrapes_the_captured_bodies_and_records_them_normalised(
    prometheus_bin, tmp_path
):
    switched = threading.Event()
    with serve(_exporters(switched)) as address:
        config = _scrape_config(address) + "rule_files: [sources.yaml]\n"
        with prometheus(prometheus_bin, tmp_path, config, {"sources.yaml": _rules()}) as base:
            # h1's target, the one scraped with the exporter pod's labels, may come second.
            exported = wait_for(
                lambda: query(base, 'DCGM_FI_DEV_GPU_UTIL{exported_pod!=""}')["data"]["result"],
                60,
                "Prometheus to scrape h1's dcgm",
            )
            assert {r["metric"]["pod"] for r in exported} == {"nvidia-dcgm-exporter-x7k2p"}
            _check(base, switched)


def test_victoria_metrics_and_vmalert_record_the_same(victoria_metrics_bin, vmalert_bin, tmp_path):
    switched = threading.Event()
    with contextlib.ExitStack() as stack:
        address = stack.enter_context(serve(_exporters(switched)))
        vm = stack.enter_context(
            victoria_metrics(victoria_metrics_bin, tmp_path, _scrape_config(address))
        )
        notifier, _ = stack.enter_context(webhook_sink())
        stack.enter_context(
            vmalert(vmalert_bin, tmp_path, {"sources.yaml": _rules()}, vm, notifier, "1s")
        )
        exported = wait_for(
            lambda: query(vm, 'DCGM_FI_DEV_GPU_UTIL{exported_pod!=""}')["data"]["result"],
            30,
            "VictoriaMetrics to scrape dcgm",
        )
        assert {r["metric"]["pod"] for r in exported} == {"nvidia-dcgm-exporter-x7k2p"}
        _check(vm, switched)

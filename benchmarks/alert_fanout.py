"""What one alert instance costs Prometheus per evaluation, and how much of it is templates.

    python benchmarks/alert_fanout.py [--alerts 8000] [--readings 5]

A per-GPU rule fires once per GPU: on a 1,000-node fleet with 8 GPUs each, LowGPUUtilization
can hold 8,000 alert instances, and Prometheus 2.42 expands every label and annotation of
each through Go's text/template at every evaluation, a template without `{{` included. This
serves `--alerts` always-true series with a GPU's labels and, for each variant of the shipped
`TrainingLowGPUUtilization` alert (its labels and annotations as compiled), runs a real
Prometheus evaluating it every 5 s, and prints the median `evaluationTime` of its group over
`--readings` evaluations:

- bare: the alert without labels or annotations;
- labels / annotations: the shipped labels only, the shipped annotations only;
- shipped: both, as compiled;
- labels in the expression: the same static labels set by `label_replace` in the expression
  instead of the rule's `labels:`, the annotations as shipped;
- the expression alone, as a recording rule (what the `label_replace` calls cost).

One variant per Prometheus, one after the other, so the variants do not share the cores.
"""

from __future__ import annotations

import argparse
import http.server
import statistics
import tempfile
import threading
import time
from pathlib import Path

from trainprof.engines.localstack import prometheus
from trainprof.engines.prometheus_api import PrometheusAPI
from trainprof.generation.render import to_yaml
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config

PROMETHEUS = "/usr/bin/prometheus"


def shipped_alert() -> dict:
    """The compiled default's first TrainingLowGPUUtilization alert (reason underutilized)."""
    compiled = compile_rules(load_config({"rules": [{"rule": "LowGPUUtilization"}]}))
    for group in compiled.groups:
        for rule in group["rules"]:
            if rule.get("alert") == "TrainingLowGPUUtilization":
                return rule
    raise SystemExit("no TrainingLowGPUUtilization in the compiled default")


def body(alerts: int) -> bytes:
    lines = (
        f'gpu_up{{node="n{i // 8}",gpu="{i % 8}",uuid="GPU-{i:08d}",'
        f'namespace="ml",training_job="job{i % 100}"}} 1\n'
        for i in range(alerts)
    )
    return "".join(lines).encode()


def serve(payload: bytes) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            head = (
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n"
            )
            self.wfile.write(head.encode() + payload)  # one write: no Nagle delay

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def variants(alert: dict) -> dict[str, dict]:
    labels, annotations = alert.get("labels", {}), alert.get("annotations", {})
    expr = "gpu_up > 0"
    in_expr = expr
    for name, value in labels.items():
        in_expr = f'label_replace({in_expr}, "{name}", "{value}", "", "")'
    return {
        "bare": {"alert": "A", "expr": expr},
        "labels": {"alert": "A", "expr": expr, "labels": labels},
        "annotations": {"alert": "A", "expr": expr, "annotations": annotations},
        "shipped": {"alert": "A", "expr": expr, "labels": labels, "annotations": annotations},
        "labels in the expression": {"alert": "A", "expr": in_expr, "annotations": annotations},
        "the expression alone (recording)": {"record": "a", "expr": in_expr},
    }


def measure(rule: dict, address: str, readings: int) -> tuple[float, int]:
    """Median evaluation seconds of the rule's group, and its alert instances."""
    config = (
        "global: {scrape_interval: 5s, evaluation_interval: 5s}\n"
        "rule_files: [rules.yml]\n"
        f"scrape_configs:\n- job_name: gpus\n  static_configs: [{{targets: ['{address}']}}]\n"
    )
    rules = to_yaml({"groups": [{"name": "fanout", "interval": "5s", "rules": [rule]}]})
    with tempfile.TemporaryDirectory() as tmp:
        with prometheus(PROMETHEUS, Path(tmp), config, {"rules.yml": rules}) as base:
            seen: list[float] = []
            last = None
            instances = 0
            deadline = time.monotonic() + 60 + 10 * readings
            while len(seen) < readings + 2 and time.monotonic() < deadline:
                time.sleep(1)
                group = PrometheusAPI(base, timeout=5.0).rule_groups()[0]
                if group["lastEvaluation"] == last or group["evaluationTime"] == 0:
                    continue
                last = group["lastEvaluation"]
                instances = len(group["rules"][0].get("alerts", []))
                seen.append(group["evaluationTime"])
    # The first two evaluations run while the series are still being created.
    return statistics.median(seen[2:] or seen), instances


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--alerts", type=int, default=8000)
    parser.add_argument("--readings", type=int, default=5)
    args = parser.parse_args()
    alert = shipped_alert()
    server = serve(body(args.alerts))
    address = f"127.0.0.1:{server.server_address[1]}"
    print(f"{args.alerts} series, Prometheus at {PROMETHEUS}, median of {args.readings}")
    print("| variant | templates per instance | instances | evaluation | per instance |")
    print("|---|---|---|---|---|")
    for name, rule in variants(alert).items():
        seconds, instances = measure(rule, address, args.readings)
        templates = len(rule.get("labels", {})) + len(rule.get("annotations", {}))
        per = seconds / max(instances, args.alerts) * 1e6
        print(f"| {name} | {templates} | {instances} | {seconds * 1000:.0f} ms | {per:.0f} us |")
    server.shutdown()


if __name__ == "__main__":
    main()

"""Alert instances and their cost per evaluation, one alert per GPU against one per job.

    python benchmarks/alert_instances.py [--gpus 8] [--jobs 100] [--nodes-per-job 10]
        [--readings 5] [--rounds 3]

A fleet of `--jobs` jobs x `--nodes-per-job` nodes x `--gpus` GPUs, every GPU idle: the
LowGPUUtilization condition holds for each. A loopback server serves, per GPU, the
recording that rule's alert reads (`gpu:...:fraction_below70_rate4m10s`, at 1.0: every
sample at or below 70 %) with the GPU's labels, and a real Prometheus 2.42 evaluates every
5 s one of three groups:

- per GPU: the alert as trainprof compiled it before one alert per job (its labels and
  annotations as they were: one instance per GPU, the GPU named in its description);
- per job: the group as compiled now: the `affected` recording (one series per GPU) and one
  alert per job counting it, held through noise, whose description runs two `query`
  templates (the job's GPUs, its worst three);
- per job, static description: the same without those two queries (their cost).

For each it prints the alert instances (pending: `for:` is 8m20s, and Prometheus templates
pending alerts too) and the median `evaluationTime` of the group over `--readings`
evaluations. Rounds interleave the variants, one Prometheus at a time, so they do not share
the cores; the table gives each variant's median, min and max over `--rounds`.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

from alert_fanout import PROMETHEUS, serve

from trainprof.engines.localstack import prometheus
from trainprof.engines.prometheus_api import PrometheusAPI
from trainprof.generation.render import to_yaml
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config

RECORD = "gpu:trainprof_gpu_utilization_sampled_ratio:fraction_below70_rate4m10s"

# TrainingLowGPUUtilization (underutilized) as trainprof compiled it before one alert per
# job (main at ac66343): one instance per GPU, the GPU in its labels and its description.
PER_GPU = {
    "alert": "TrainingLowGPUUtilization",
    "expr": f"{RECORD} > 0.95",
    "for": "8m20s",
    "labels": {
        "rule": "LowGPUUtilization",
        "severity": "warning",
        "trainprof_rule_version": "1",
        "reason": "underutilized",
    },
    "annotations": {
        "summary": "A GPU is underutilized.",
        "description": "GPU {{ $labels.gpu }} on {{ or $labels.node $labels.instance }} (job "
        '{{ or $labels.training_job "(no training_job label)" }}): over the last 4m10s, '
        "{{ $value | humanizePercentage }} of the samples (the rule needs more than 95%) were "
        "at or below 70% utilization: its 95th percentile is below 70%.",
        "recommendation": "If the GPU is underused, raise the batch size or move to a smaller "
        "or shared GPU.",
        "runbook_url": "https://github.com/trainprof/trainprof/blob/main/docs/rules.md"
        "#lowgpuutilization",
        "dashboard_url": "http://localhost:3000/d/trainprof-job/trainprof-job?var-training_job="
        "{{ $labels.training_job | urlquery }}&var-namespace={{ $labels.namespace | urlquery }}",
    },
}


def per_job() -> list[dict]:
    """The compiled group's affected recording and alert for reason underutilized."""
    compiled = compile_rules(load_config({"rules": [{"rule": "LowGPUUtilization"}]}))
    group = next(g for g in compiled.groups if g["name"] == "trainprof.LowGPUUtilization")
    return [
        r
        for r in group["rules"]
        if (r.get("labels") or {}).get("reason") == "underutilized"
        and (r.get("record", "").endswith(":affected") or "alert" in r)
    ]


def static(rules: list[dict]) -> list[dict]:
    out = copy.deepcopy(rules)
    for rule in out:
        if "alert" in rule:
            rule["annotations"]["description"] = "Job {{ $labels.training_job }}: GPUs idle."
    return out


def body(gpus: int, jobs: int, nodes: int) -> bytes:
    lines = []
    for j in range(jobs):
        for n in range(nodes):
            for g in range(gpus):
                node = f"n{j * nodes + n}"
                lines.append(
                    f'{RECORD}{{job="trainprof",instance="{node}:9945",node="{node}",gpu="{g}",'
                    f'uuid="GPU-{node}-{g}",namespace="ml",training_job="job{j}"}} 1\n'
                )
    return "".join(lines).encode()


def measure(rules: list[dict], address: str, readings: int) -> tuple[float, int]:
    """Median evaluation seconds of the group, and its alert instances."""
    config = (
        "global: {scrape_interval: 5s, evaluation_interval: 5s}\n"
        "rule_files: [rules.yml]\n"
        f"scrape_configs:\n- job_name: fleet\n  honor_labels: true\n"
        f"  static_configs: [{{targets: ['{address}']}}]\n"
    )
    text = to_yaml({"groups": [{"name": "g", "interval": "5s", "rules": rules}]})
    with tempfile.TemporaryDirectory() as tmp:
        with prometheus(PROMETHEUS, Path(tmp), config, {"rules.yml": text}) as base:
            api = PrometheusAPI(base, timeout=10.0)
            seen: list[float] = []
            last, instances = None, 0
            deadline = time.monotonic() + 90 + 10 * readings
            while len(seen) < readings + 2 and time.monotonic() < deadline:
                time.sleep(1)
                group = api.rule_groups()[0]
                if group["lastEvaluation"] == last or group["evaluationTime"] == 0:
                    continue
                last = group["lastEvaluation"]
                instances = sum(len(r.get("alerts", [])) for r in group["rules"])
                seen.append(group["evaluationTime"])
    if len(seen) < 3:
        sys.exit("Prometheus did not evaluate the group often enough: a busy machine?")
    return statistics.median(seen[2:]), instances


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--nodes-per-job", type=int, default=10)
    parser.add_argument("--readings", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if min(args.gpus, args.jobs, args.nodes_per_job, args.readings, args.rounds) < 1:
        parser.error("every count must be at least 1")
    new = per_job()
    variants = {"per GPU (before)": [PER_GPU], "per job (now)": new, "per job, static": static(new)}
    server = serve(body(args.gpus, args.jobs, args.nodes_per_job))
    address = f"127.0.0.1:{server.server_address[1]}"
    gpus = args.gpus * args.jobs * args.nodes_per_job
    times: dict[str, list[float]] = {name: [] for name in variants}
    instances: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, rules in variants.items():
            seconds, instances[name] = measure(rules, address, args.readings)
            times[name].append(seconds)
    server.shutdown()
    print(f"{gpus} idle GPUs in {args.jobs} jobs, Prometheus 2.42, evaluated every 5 s")
    print("| group | alert instances | evaluation (median, min-max) | per GPU |")
    print("|---|---|---|---|")
    for name, seen in times.items():
        med = statistics.median(seen)
        print(
            f"| {name} | {instances[name]} | {med * 1000:.1f} ms ({min(seen) * 1000:.1f}-"
            f"{max(seen) * 1000:.1f}) | {med / gpus * 1e6:.1f} us |"
        )


if __name__ == "__main__":
    main()

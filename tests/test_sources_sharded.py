"""node_exporter's per-core counters on Prometheus servers sharded by node: two real
Prometheus shards (hashmod on the node's name) record the `shard` tier, a global Prometheus
federates their per-node recordings, scrapes dcgm-exporter and kube-state-metrics and
evaluates the `global` tier. A single Prometheus scraping everything with every group loaded
must reach the same verdicts.

Job `bert` runs on h1, h2 and h3; hashmod 2 puts h1 on shard 0 and h2, h3 on shard 1. h1's
and h2's GPUs idle at 5 % while one of their cores is saturated, h3's GPU works at 90 % with
idle cores: two thirds of the job's scrapes are CPU bottlenecks, so CPUBottleneck (above
50 %) fires on the whole job, while either shard alone would see 100 % or 50 %.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys

import pytest
import yaml

from real_exporters import ScriptedExporters, gpu_labels, serve, variant
from trainprof.engines.localstack import prometheus
from trainprof.generation.render import to_yaml
from trainprof.report import from_prometheus
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config
from trainprof.sources.tiers import federation_match, tier

from servers import get_json, query, wait_for, wait_for_firing

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
            "parameters": {"threshold": 50, "patience": 4, "scan_interval_us": 1_000_000},
        },
        {"rule": "OverallSystemUsage", "parameters": {"scan_interval_us": 1_000_000}},
    ],
}
PODS = {"h1": "bert-worker-0", "h2": "bert-worker-1", "h3": "bert-worker-2"}
SHARDS = {"h1": 0, "h2": 1, "h3": 1}  # hashmod 2 of the node's name
STARVED = ("h1", "h2")
SERVED = ("single", "global")  # the servers the rules' verdicts are read from
GLOBAL = "global: {scrape_interval: 1s, scrape_timeout: 900ms, evaluation_interval: 1s}\n"


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
        return {"DCGM_FI_DEV_GPU_UTIL": 5 if uuid.removeprefix("GPU-") in STARVED else 90}

    def cpu_script(t: float, host: str, cpu: str) -> tuple[float, float]:
        return (0.97, 0.0) if host in STARVED and cpu == "0" else (0.0, 0.0)

    namespace = gpu_labels()["namespace"]
    pod_jobs = {(namespace, pod): "bert" for pod in PODS.values()}
    return ScriptedExporters(gpus, gpu_script, cpu_script, pod_jobs=pod_jobs)


def _targets(address: str, kind: str) -> str:
    lines = [f"- job_name: {kind}\n  static_configs:"]
    for host in PODS:
        node = f", node: {host}" if kind == "node" else ""
        lines.append(
            f"  - targets: ['{address}']\n    labels: {{__metrics_path__: /{kind}/{host}{node}}}"
        )
    return "\n".join(lines) + "\n"


def _ksm(address: str) -> str:
    return (
        "- job_name: kube-state-metrics\n  honor_labels: true\n  static_configs:\n"
        f"  - targets: ['{address}']\n    labels: {{__metrics_path__: /ksm/all}}\n"
    )


def _shard_config(address: str, shard: int) -> str:
    """node_exporter's targets whose node hashes to `shard` of 2 (as docs/sources.md)."""
    relabel = (
        "  relabel_configs:\n"
        "  - {source_labels: [node], modulus: 2, target_label: __tmp_shard, action: hashmod}\n"
        f"  - {{source_labels: [__tmp_shard], regex: '{shard}', action: keep}}\n"
    )
    return (
        GLOBAL.replace("global: {", f"global: {{external_labels: {{shard: '{shard}'}}, ")
        + "scrape_configs:\n"
        + _targets(address, "node")
        + relabel
        + "rule_files: [rules.yaml]\n"
    )


def _global_config(address: str, shards: list[str]) -> str:
    """dcgm-exporter and kube-state-metrics scraped, the shards' per-node recordings
    federated."""
    hosts = ", ".join(f"'{s.removeprefix('http://')}'" for s in shards)
    federate = (
        "- job_name: federate\n  honor_labels: true\n  metrics_path: /federate\n"
        f"  params: {{'match[]': ['{federation_match()}']}}\n"
        f"  static_configs:\n  - targets: [{hosts}]\n"
    )
    return (
        GLOBAL
        + "scrape_configs:\n"
        + _targets(address, "dcgm")
        + _ksm(address)
        + federate
        + "rule_files: [rules.yaml]\n"
    )


def _firing(base: str) -> set[tuple]:
    alerts = get_json(f"{base}/api/v1/alerts")["data"]["alerts"]
    return {tuple(sorted(a["labels"].items())) for a in alerts if a["state"] == "firing"}


def _value(base: str, expr: str) -> float | None:
    result = query(base, expr)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def test_two_shards_and_a_global_server_reach_one_servers_verdicts(prometheus_bin, tmp_path):
    config = load_config(CONFIG)
    groups = compile_rules(config).groups
    rules = {name: to_yaml({"groups": tier(groups, name)}) for name in ("all", "shard", "global")}
    with contextlib.ExitStack() as stack:
        address = stack.enter_context(serve(_exporters()))
        servers = {}
        for name in ("single", "shard0", "shard1", "global"):
            (tmp_path / name).mkdir()
        single_config = (
            GLOBAL
            + "scrape_configs:\n"
            + _targets(address, "dcgm")
            + _targets(address, "node")
            + _ksm(address)
            + "rule_files: [rules.yaml]\n"
        )
        servers["single"] = stack.enter_context(
            prometheus(
                prometheus_bin, tmp_path / "single", single_config, {"rules.yaml": rules["all"]}
            )
        )
        for shard in (0, 1):
            servers[f"shard{shard}"] = stack.enter_context(
                prometheus(
                    prometheus_bin,
                    tmp_path / f"shard{shard}",
                    _shard_config(address, shard),
                    {"rules.yaml": rules["shard"]},
                )
            )
        servers["global"] = stack.enter_context(
            prometheus(
                prometheus_bin,
                tmp_path / "global",
                _global_config(address, [servers["shard0"], servers["shard1"]]),
                {"rules.yaml": rules["global"]},
            )
        )
        # The job's nodes land on both shards, and only there are their cores read.
        for shard in (0, 1):
            base = servers[f"shard{shard}"]
            want = {h for h, s in SHARDS.items() if s == shard}
            wait_for(
                lambda base=base, want=want: (
                    {
                        r["metric"]["node"]
                        for r in query(base, "node:trainprof_cpu_core_utilization:max")["data"][
                            "result"
                        ]
                    }
                    == want
                ),
                60,
                f"shard {shard} to record {sorted(want)}",
            )
        assert _value(servers["global"], "count(node_cpu_seconds_total)") is None

        for name in ("single", "global"):
            wait_for_firing(servers[name], {"LowGPUUtilization", "CPUBottleneck"}, timeout=120)
        # Both count two thirds of the job's scrapes as bottlenecks (h1 on one shard, h2 and
        # h3 on the other), once the first seconds (the servers started one after the other,
        # the shards' recordings reach the global server a federation scrape later) weigh
        # little in the share since the job started.
        share = (
            "training_job:trainprof_cpu_bottleneck_samples:ratio_over_time2h30m"
            '{training_job="bert"}'
        )

        def shares() -> dict[str, float | None]:
            return {name: _value(servers[name], share) for name in SERVED}

        def agree() -> bool:
            now = shares()
            return all(v is not None and abs(v - 2 / 3) < 0.05 for v in now.values())

        wait_for(agree, 120, f"both servers' bottleneck share near 2/3 (last: {shares()})")
        wait_for(
            lambda: _firing(servers["single"]) == _firing(servers["global"]),
            60,
            "the same alerts firing on the single and the global server",
        )
        low = {
            dict(a)["node"]
            for a in _firing(servers["global"])
            if dict(a).get("rule") == "LowGPUUtilization" and "node" in dict(a)
        }
        assert low <= set(STARVED), low
        # The report reads the same verdicts and usage from either.
        reports = {name: from_prometheus(servers[name], "bert", config) for name in SERVED}
        for rule in ("LowGPUUtilization", "CPUBottleneck"):
            assert reports["global"].verdicts[rule].fired, rule
            assert reports["single"].verdicts[rule].fired, rule


def _compile(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "rules", "compile", "-q", "-o", "-", *args],
        capture_output=True,
        text=True,
    )


def test_the_tiers_split_the_compiled_rules_without_losing_or_repeating_one():
    """Every rule of the one-server file is in exactly one tier, in the same order, and the
    shard tier reads nothing but node_exporter's series and its own recordings."""
    source = ("--source", "dcgm,node_exporter")
    files = {
        name: yaml.safe_load(_compile(*source, "--tier", name).stdout)["groups"]
        for name in ("all", "shard", "global")
    }

    def names(groups: list[dict]) -> list[str]:
        return [
            r.get("record") or r["alert"] + str(r.get("labels")) for g in groups for r in g["rules"]
        ]

    shard, rest = names(files["shard"]), names(files["global"])
    assert sorted(shard + rest) == sorted(names(files["all"]))
    assert not set(shard) & set(rest)
    assert [g["name"] for g in files["shard"]] == ["trainprof.sources.nodes"]
    recorded = {r["record"] for g in files["shard"] for r in g["rules"] if "record" in r}
    for rule in (r for g in files["shard"] for r in g["rules"]):
        read = set(re.findall(r"[a-zA-Z_:][\w:]*(?=[\[{)\s]|$)", rule["expr"]))
        inputs = {n for n in read if n.startswith(("node_", "cpu:", "node:"))}
        assert inputs <= recorded | {n for n in read if n.startswith("node_")}, rule
        assert "training_job" not in rule["expr"], rule  # nothing per job on a shard


@pytest.mark.parametrize(
    "args, message",
    [
        (("--source", "dcgm", "--tier", "shard"), "--tier shard: nothing to shard"),
        (("--tier", "global"), "--tier global: nothing to shard"),
        (
            ("--source", "node_exporter", "--tier", "shard", "--format", "helm-values"),
            "--tier takes --format rules or prometheusrule",
        ),
    ],
)
def test_a_tier_with_nothing_to_shard_is_refused_with_exit_2(args, message):
    result = _compile(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""

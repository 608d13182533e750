"""The compiled rules split for Prometheus servers sharded by node, with a global server
over them: node_exporter's per-core reduction on the shards, everything else on the global.

CPUBottleneck and IOBottleneck need every core's `idle` and `iowait` counters at every scrape
(docs/sources.md, "node_exporter's per-core counters on a large fleet"). Where one Prometheus
cannot read them all, each shard scrapes a share of the nodes (`hashmod` on the node's name)
and records, per core and then per node, what `node_exporter.recordings` records: the
`shard` tier, one group. The global server federates the per-node recordings
(`federation_match`), scrapes what is not sharded (dcgm-exporter, kube-state-metrics, the
ranks) and evaluates every other group: the `global` tier. Every rule that reads more than one
node (the job maps, the per-job sums, the alerts) is in the global tier, so a job whose nodes
land on different shards is judged as on one server.

>>> from trainprof.rules.compiler import compile_rules
>>> from trainprof.rules.config import load_config
>>> config = load_config({"source": "dcgm,node_exporter", "rules": ["CPUBottleneck"]})
>>> compiled = compile_rules(config)
>>> [(g["name"], len(g["rules"])) for g in tier(compiled.groups, "shard")]
[('trainprof.sources.nodes', 14)]
>>> [g["name"] for g in tier(compiled.groups, "global")][:3]
['trainprof.sources.devices', 'trainprof.sources.inventory', 'trainprof.sources']
>>> print(federation_match().replace("|", "|\\n"))
{__name__=~"node:trainprof_cpu_utilization:ratio|
node:trainprof_cpu_iowait:ratio|
node:trainprof_cpu_core_utilization:max|
node:trainprof_cpu_core_iowait:max|
node:trainprof_memory_used:bytes|
node:trainprof_memory_used:ratio|
node:trainprof_disk_read_bytes:rate|
node:trainprof_disk_written_bytes:rate|
node:trainprof_network_receive_bytes:rate|
node:trainprof_network_transmit_bytes:rate|
node:trainprof_io_pressure_waiting:ratio"}
"""

from __future__ import annotations

import copy
from typing import Any

from trainprof.sources import node_exporter
from trainprof.sources.groups import GROUP
from trainprof.sources.options import SourceOptions

TIERS = ("all", "shard", "global")
SHARD_GROUP = "trainprof.sources.nodes"


def _node_records() -> set[str]:
    # The names do not depend on the options (only the expressions do).
    return {r["record"] for r in node_exporter.recordings(SourceOptions())}


def _on_shard(rule: dict[str, Any]) -> bool:
    """A rule of `trainprof.sources` that reads only one node's node_exporter series: its
    per-core and per-node recordings, and the alert saying none reach this server."""
    if "record" in rule:
        return rule["record"] in _node_records()
    labels = rule.get("labels", {})
    return labels.get("input") == "node_cpu_seconds_total" and labels.get("scope") == "cluster"


def tier(groups: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """The groups of `name` (TIERS): all of them, the shards' or the global server's.

    Raises ValueError when nothing in `groups` reads node_exporter: there is nothing to
    shard."""
    if name not in TIERS:
        raise ValueError(f"unknown tier {name!r} (known: {', '.join(TIERS)})")
    if name == "all":
        return groups
    sources = next((g for g in groups if g["name"] == GROUP), None)
    shard = [r for r in sources["rules"] if _on_shard(r)] if sources else []
    if sources is None or not any("record" in r for r in shard):
        raise ValueError(
            "nothing to shard: the rules read no node_exporter series (the per-core "
            "counters are what a shard reduces); compile with a source naming node_exporter"
        )
    if name == "shard":
        return [{"name": SHARD_GROUP, "interval": sources["interval"], "rules": shard}]
    out = []
    for group in groups:
        if group is sources:
            group = copy.deepcopy(group)
            group["rules"] = [r for r in group["rules"] if not _on_shard(r)]
        out.append(group)
    return out


def federation_match() -> str:
    """The `match[]` selector with which the global server federates the shards' per-node
    recordings (their per-core ones stay on the shards)."""
    names = [r["record"] for r in node_exporter.recordings(SourceOptions())]
    return f'{{__name__=~"{"|".join(n for n in names if n.startswith("node:"))}"}}'

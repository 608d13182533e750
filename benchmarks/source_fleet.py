"""What dcgm-exporter, node_exporter and kube-state-metrics serve for a fleet of GPU nodes,
built from the real captures in tests/data/real-exporters, for rules_at_scale.py.

Per node: dcgm-exporter's captured series (25 fields, the GPU Operator's label set) for each
GPU, with the node's `Hostname`, a fleet-unique `UUID` and the node's workload pod; and
node_exporter's cpu, meminfo, diskstats, netdev and pressure collectors as captured, with
`node_cpu_seconds_total` for every core in each of the captured modes and a `node` label (as
a relabelling from `__meta_kubernetes_pod_node_name` would set it). Each GPU's utilization
is drawn at every scrape like the trainprof fake's samples (uniform 0-100 %), memory around
half used; each core's counters advance by one scrape interval split between busy (uniform),
iowait (up to 10 %) and idle, busy spread over the captured busy modes; disk, network and
I/O-pressure counters advance too. Jobs: kube-state-metrics' `kube_pod_labels` maps each
node's worker pod to its job (node n in job n % jobs), or, with `attribution="assignment"`,
the ranks' `trainprof_gpu_assignment_info` maps each GPU.

All nodes serve the same values (one node's body is rendered per scrape, then repeated with
the node's name), as the trainprof fake does.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterable
from pathlib import Path

REAL = Path(__file__).resolve().parent.parent / "tests" / "data" / "real-exporters"
DCGM = REAL / "dcgm-exporter-rtx4000ada-gpu-operator.prom"
NODE = REAL / "node-exporter-e2e-output.prom"

NODE_NAME, JOB_NAME = "@NODE@", "@JOB@"
NAMESPACE = "default"
# node_exporter collectors served whole (the rules read cpu, meminfo, diskstats, netdev and
# pressure; its other collectors would only add series no rule selects).
NODE_FAMILIES = ("node_cpu_", "node_memory_", "node_disk_", "node_network_", "node_pressure_")
BUSY_MODES = {"user": 0.75, "system": 0.2, "softirq": 0.03, "irq": 0.01, "nice": 0.01}
NET_DEVICES = ("bond0", "eth0", "lo")
SCRAPE = 15.0
SAMPLE = re.compile(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _capture(path: Path) -> tuple[list[tuple[str, dict[str, str], float]], dict[str, str]]:
    """A capture's samples, as exposed (names unchanged), and each family's HELP/TYPE lines."""
    samples, headers = [], {}
    for line in path.read_text().split("\n"):
        if line.startswith(("# HELP ", "# TYPE ")):
            name = line.split(" ", 3)[2]
            headers[name] = headers.get(name, "") + line + "\n"
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            labels = {k: v.replace('\\"', '"') for k, v in LABEL.findall(m.group(2) or "")}
            samples.append((m.group(1), labels, float(m.group(3))))
    return samples, headers


def node_name(n: int) -> str:
    return f"n{n:04d}"


def hashmod(value: str, modulus: int) -> int:
    """Prometheus' `hashmod` relabelling of `value`: the MD5's last 8 bytes, big-endian,
    modulo `modulus` (which shard scrapes a node whose name is `value`)."""
    return int.from_bytes(hashlib.md5(value.encode()).digest()[8:], "big") % modulus


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _line(name: str, labels: dict[str, str], value: float) -> str:
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    value = float(value)
    return f"{name}{{{body}}} {value!r}\n" if labels else f"{name} {value!r}\n"


class SourceFleet:
    """The exposition of `nodes` hosts' dcgm-exporter (when `dcgm`), node_exporter (when
    `node_exporter`) and job attribution, advanced one scrape interval at every `body()`."""

    def __init__(
        self,
        nodes: int,
        gpus: int,
        cores: int,
        jobs: int,
        dcgm: bool = True,
        node_exporter: bool = True,
        attribution: str = "pod",
    ):
        if attribution not in ("pod", "assignment", "none"):
            raise ValueError(f"attribution must be pod, assignment or none, got {attribution!r}")
        self.nodes, self.gpus, self.cores, self.jobs = nodes, gpus, cores, jobs
        self.dcgm, self.node_exporter, self.attribution = dcgm, node_exporter, attribution
        self.rng = random.Random(1)
        self.dcgm_samples, dcgm_headers = _capture(DCGM)
        node_samples, node_headers = _capture(NODE)
        self.node_samples = [
            (n, lb, v)
            for n, lb, v in node_samples
            if n.startswith(NODE_FAMILIES) and "node" not in lb and "numa" not in n
        ]
        self.modes = sorted(
            {lb["mode"] for n, lb, _ in node_samples if n == "node_cpu_seconds_total"}
        )
        self.memory = {n: v for n, lb, v in self.node_samples if n.startswith("node_memory_")}
        self.cpu_seconds = {(c, m): 1000.0 for c in range(cores) for m in self.modes}
        self.counters: dict[tuple[str, str], float] = {}
        headers = []
        if dcgm:
            headers += [dcgm_headers[n] for n in dict.fromkeys(n for n, _, _ in self.dcgm_samples)]
        if node_exporter:
            served = dict.fromkeys(n for n, _, _ in self.node_samples)
            headers += [node_headers[n] for n in served if n in node_headers]
            headers += [
                f"# TYPE node_network_{d}_bytes_total counter\n" for d in ("receive", "transmit")
            ]
        if attribution == "pod":
            headers.append("# TYPE kube_pod_labels gauge\n")
        elif attribution == "assignment":
            headers.append("# TYPE trainprof_gpu_assignment_info gauge\n")
        self.header = "".join(headers)
        self.static_node = "".join(
            _line(n, {**lb, "node": NODE_NAME}, v)
            for n, lb, v in self.node_samples
            if n != "node_cpu_seconds_total"
            and n != "node_memory_MemAvailable_bytes"
            and n not in ("node_disk_read_bytes_total", "node_disk_written_bytes_total")
            and n != "node_pressure_io_waiting_seconds_total"
        )
        self.disks = sorted(
            {lb["device"] for n, lb, _ in self.node_samples if n == "node_disk_read_bytes_total"}
        )

    def _gpu_lines(self) -> list[str]:
        captured = next(lb for n, lb, _ in self.dcgm_samples if n == "DCGM_FI_DEV_GPU_UTIL")
        fields = {n: v for n, _, v in self.dcgm_samples}
        total = fields["DCGM_FI_DEV_FB_USED"] + fields["DCGM_FI_DEV_FB_FREE"]
        reserved = fields["DCGM_FI_DEV_FB_RESERVED"]
        total += reserved
        out = []
        for i in range(self.gpus):
            util = round(100 * self.rng.random())
            used = round(total * (0.5 + 0.01 * self.rng.random()))
            scripted = {
                "DCGM_FI_DEV_GPU_UTIL": util,
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": util / 100,
                "DCGM_FI_DEV_FB_USED": used,
                "DCGM_FI_DEV_FB_FREE": total - reserved - used,
            }
            labels = {
                **captured,
                "gpu": str(i),
                "UUID": f"GPU-{NODE_NAME}-{i:02d}",
                "pci_bus_id": f"00000000:{i + 1:02X}:00.0",
                "device": f"nvidia{i}",
                "Hostname": NODE_NAME,
                "pod": f"{JOB_NAME}-worker-{NODE_NAME}",
            }
            for name, field_labels, value in self.dcgm_samples:
                extra = {k: v for k, v in field_labels.items() if k in ("err_code", "err_msg")}
                out.append(_line(name, {**labels, **extra}, scripted.get(name, value)))
        return out

    def _host_lines(self) -> list[str]:
        out = []
        for cpu in range(self.cores):
            iowait = 0.1 * self.rng.random()
            busy = self.rng.random() * (1 - iowait)
            shares = {m: busy * BUSY_MODES.get(m, 0.0) for m in self.modes}
            shares["iowait"], shares["idle"] = iowait, 1 - busy - iowait
            for mode in self.modes:
                self.cpu_seconds[cpu, mode] += SCRAPE * shares[mode]
                out.append(
                    f'node_cpu_seconds_total{{cpu="{cpu}",mode="{mode}",node="{NODE_NAME}"}} '
                    f"{self.cpu_seconds[cpu, mode]:.2f}\n"
                )
        total = self.memory["node_memory_MemTotal_bytes"]
        available = total * (0.6 - 0.01 * self.rng.random())
        out.append(_line("node_memory_MemAvailable_bytes", {"node": NODE_NAME}, available))
        for name, labels, rate in (
            *(("node_disk_read_bytes_total", {"device": d}, 50e6) for d in self.disks),
            *(("node_disk_written_bytes_total", {"device": d}, 20e6) for d in self.disks),
            *(("node_network_receive_bytes_total", {"device": d}, 1e9) for d in NET_DEVICES),
            *(("node_network_transmit_bytes_total", {"device": d}, 1e9) for d in NET_DEVICES),
            ("node_pressure_io_waiting_seconds_total", {}, 0.05),
        ):
            key = (name, labels.get("device", ""))
            value = self.counters.get(key, 0.0) + SCRAPE * rate * self.rng.random()
            self.counters[key] = value
            out.append(_line(name, {**labels, "node": NODE_NAME}, value))
        return out

    def _attribution_lines(self) -> list[str]:
        if self.attribution == "none":  # served by another target (rules_at_scale --shards)
            return []
        if self.attribution == "pod":
            labels = {
                "namespace": NAMESPACE,
                "pod": f"{JOB_NAME}-worker-{NODE_NAME}",
                "uid": f"uid-{NODE_NAME}",
                "label_training_kubeflow_org_job_name": JOB_NAME,
                "label_training_kubeflow_org_replica_type": "worker",
            }
            return [_line("kube_pod_labels", labels, 1)]
        return [
            _line(
                "trainprof_gpu_assignment_info",
                {
                    "namespace": NAMESPACE,
                    "training_job": JOB_NAME,
                    "rank": str(i),
                    "node": NODE_NAME,
                    "gpu": str(i),
                    "uuid": f"GPU-{NODE_NAME}-{i:02d}",
                },
                1,
            )
            for i in range(self.gpus)
        ]

    def one_node(self) -> str:
        """One node's samples, with NODE_NAME and JOB_NAME for its name and its job's, after
        advancing one scrape interval."""
        lines = self._gpu_lines() if self.dcgm else []
        if self.node_exporter:
            lines += [self.static_node, *self._host_lines()]
        lines += self._attribution_lines()
        return "".join(lines)

    def body(self, one: str | None = None, nodes: Iterable[int] | None = None) -> str:
        """Every node's samples (or those of `nodes`, by index), after the headers."""
        one = self.one_node() if one is None else one
        out = [self.header]
        for n in range(self.nodes) if nodes is None else nodes:
            job = f"job{n % self.jobs:03d}"
            out.append(one.replace(NODE_NAME, node_name(n)).replace(JOB_NAME, job))
        return "".join(out)

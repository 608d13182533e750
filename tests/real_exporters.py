"""The captured dcgm-exporter and node_exporter bodies (tests/data/real-exporters), their label
variants, and a loopback server that serves them with values scripted over time.

A capture is a snapshot; `ScriptedExporters` re-renders it at every scrape: dcgm gauges take
the value a script gives for the elapsed time, node_exporter's CPU counters advance by what a
script says each core spent busy, in iowait and idle since the previous scrape.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REAL = Path(__file__).resolve().parent / "data" / "real-exporters"
DCGM = REAL / "dcgm-exporter-rtx4000ada-gpu-operator.prom"
NODE = REAL / "node-exporter-e2e-output.prom"

Sample = tuple[str, dict[str, str], float]


def read_capture(path: Path) -> tuple[list[Sample], dict[str, str]]:
    """The samples of a capture, and each family's `# HELP`/`# TYPE` header lines."""
    text = path.read_text()
    samples, headers = [], {}
    served = {line.partition("{")[0] for line in text.splitlines() if not line.startswith("#")}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            # The parser names a counter's samples `_total`; dcgm-exporter's counters do not.
            name = s.name if s.name in served else s.name.removesuffix("_total")
            samples.append((name, dict(s.labels), float(s.value)))
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            name = line.split(" ", 3)[2]
            headers[name] = headers.get(name, "") + line + "\n"
    return samples, headers


# dcgm-exporter's label variants (tests/data/real-exporters/README.md), applied to the capture.
EXPORTER_POD = {"pod": "nvidia-dcgm-exporter-x7k2p", "namespace": "gpu-operator"}
WORKLOAD = ("pod", "namespace", "container")


def variant(labels: dict[str, str], name: str) -> dict[str, str]:
    """The captured labels as another dcgm-exporter version or scrape would deliver them.

    gpu_operator: as captured (`Hostname`, workload `pod`/`namespace`/`container`);
    hostname: the newest exporter's `hostname`; old_names: `--use-old-namespace`'s
    `pod_name`/`pod_namespace`/`container_name`, scraped with the exporter's own pod labels;
    exported: `honorLabels: false`, the workload's labels renamed `exported_*` and the
    exporter's pod in `pod`/`namespace`; no_pod: a GPU no pod holds (empty workload labels).
    """
    out = dict(labels)
    if name == "gpu_operator":
        return out
    if name == "hostname":
        out["hostname"] = out.pop("Hostname")
    elif name == "old_names":
        old = {"pod": "pod_name", "namespace": "pod_namespace", "container": "container_name"}
        for label in WORKLOAD:
            out[old[label]] = out.pop(label)
        out.update(EXPORTER_POD)
    elif name == "exported":
        for label in WORKLOAD:
            out[f"exported_{label}"] = out.pop(label)
        out.update(EXPORTER_POD)
    elif name == "no_pod":
        for label in WORKLOAD:
            out[label] = ""
    else:
        raise ValueError(f"unknown variant {name!r}")
    return out


def field_labels(captured: dict[str, str]) -> dict[str, str]:
    """The labels one field adds to the GPU's own (`err_code`, `err_msg` on XID errors)."""
    return {k: v for k, v in captured.items() if k in ("err_code", "err_msg")}


def gpu_labels() -> dict[str, str]:
    """The captured GPU's label set, as on `DCGM_FI_DEV_GPU_UTIL`."""
    samples, _ = read_capture(DCGM)
    return next(labels for name, labels, _ in samples if name == "DCGM_FI_DEV_GPU_UTIL")


def mig_instances(labels: dict[str, str], ids: tuple[str, ...]) -> list[dict[str, str]]:
    """One label set per MIG instance of the captured GPU (same `UUID`)."""
    return [{**labels, "GPU_I_PROFILE": "1g.5gb", "GPU_I_ID": i} for i in ids]


def exposition(name: str, labels: dict[str, str], value: float) -> str:
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{name}{{{body}}} {value!r}\n" if labels else f"{name} {value!r}\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


GpuScript = Callable[[float, str], dict[str, float | None]]  # (s, UUID) -> field -> value
CpuScript = Callable[[float, str, str], tuple[float, float]]  # (s, node, cpu) -> (busy, iowait)


class ScriptedExporters:
    """dcgm-exporter and node_exporter bodies for several hosts, rendered at each scrape.

    `gpus[host]` lists the label sets (from the capture, renamed with `variant`) served on that
    host's dcgm-exporter; `gpu_script(t, uuid)` overrides captured field values at `t` seconds
    since start. Each host's node_exporter serves the whole node_exporter capture with its CPU
    counters advanced by `cpu_script(t, host, cpu)` (fractions of the elapsed time busy and in
    iowait; the rest idle) and its memory from `memory_available(t, host)` when given.
    """

    def __init__(
        self,
        gpus: dict[str, list[dict[str, str]]],
        gpu_script: GpuScript,
        cpu_script: CpuScript,
        memory_available: Callable[[float, str], float] | None = None,
        pod_jobs: dict[tuple[str, str], str] | None = None,
    ):
        self.gpus, self.gpu_script, self.cpu_script = gpus, gpu_script, cpu_script
        self.memory_available = memory_available
        self.pod_jobs = pod_jobs or {}
        self.dcgm, self.dcgm_headers = read_capture(DCGM)
        self.node, self.node_headers = read_capture(NODE)
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.cpu_seconds: dict[tuple[str, str, str], float] = {}
        self.last: dict[str, float] = {}

    def dcgm_body(self, host: str) -> str:
        t = time.monotonic() - self.started
        out = ["".join(self.dcgm_headers.values())]
        for labels in self.gpus[host]:
            script = self.gpu_script(t, labels.get("UUID", ""))
            for name, captured, value in self.dcgm:
                value = script.get(name, value)
                if value is not None:  # None: a field this GPU does not serve
                    out.append(exposition(name, {**labels, **field_labels(captured)}, value))
        return "".join(out)

    def ksm_body(self, _: str = "") -> str:
        """kube-state-metrics' `kube_pod_labels` for `pod_jobs`: (namespace, pod) -> the
        PyTorchJob the pod belongs to."""
        out = ["# TYPE kube_pod_labels gauge\n"]
        for (namespace, pod), job in sorted(self.pod_jobs.items()):
            labels = {
                "namespace": namespace,
                "pod": pod,
                "uid": f"uid-{pod}",
                "label_training_kubeflow_org_job_name": job,
            }
            out.append(exposition("kube_pod_labels", labels, 1.0))
        return "".join(out)

    def node_body(self, host: str) -> str:
        with self.lock:
            now = time.monotonic() - self.started
            elapsed = now - self.last.get(host, 0.0)
            self.last[host] = now
            cpus = sorted(
                {lb["cpu"] for n, lb, _ in self.node if n == "node_cpu_seconds_total"}, key=int
            )
            for cpu in cpus:
                busy, iowait = self.cpu_script(now, host, cpu)
                for mode, share in (
                    ("user", busy),
                    ("iowait", iowait),
                    ("idle", max(0.0, 1 - busy - iowait)),
                ):
                    key = (host, cpu, mode)
                    self.cpu_seconds[key] = self.cpu_seconds.get(key, 1000.0) + share * elapsed
            out = ["".join(self.node_headers.values())]
            for name, labels, value in self.node:
                if name == "node_cpu_seconds_total":
                    value = self.cpu_seconds.get((host, labels["cpu"], labels["mode"]), value)
                elif name == "node_memory_MemAvailable_bytes" and self.memory_available:
                    value = self.memory_available(now, host)
                out.append(exposition(name, labels, value))
            return "".join(out)


@contextlib.contextmanager
def serve(exporters: ScriptedExporters) -> Iterator[str]:
    """Serve `/dcgm/<host>`, `/node/<host>` and `/ksm/all` on a free loopback port; yields
    host:port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            parts = self.path.strip("/").split("/")
            renderers = {
                "dcgm": exporters.dcgm_body,
                "node": exporters.node_body,
                "ksm": exporters.ksm_body,
            }
            if len(parts) != 2 or parts[0] not in renderers:
                self.send_error(404)
                return
            kind, host = parts
            render = renderers[kind]
            body = render(host).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()

"""Prometheus file_sd targets that a training job writes for itself (SLURM, bare metal).

Outside Kubernetes nothing tells Prometheus where a job's ranks listen. With
`TRAINPROF_FILE_SD_DIR` set (or `trainprof.start(file_sd_dir=...)`), each rank writes one
target file into that directory when it starts serving and removes it when it stops:

    /shared/prometheus/trainprof/bert-42.rank3.json
    [{"targets": ["gpu-node-07:9949"],
      "labels": {"training_job": "bert-42", "node": "gpu-node-07", "rank": "3", "local_rank": "3"}}]

Prometheus reads the directory with `file_sd_configs: [{files: [/shared/.../*.json]}]` and
`honor_labels: true` (docs/scrape/file-sd.yml). The target labels are the rank's own identity,
the very values it exposes, so the series carry them once; the target labels matter for
`up`, which then says which job a rank that stopped answering belonged to. A file left by a
rank that crashed keeps `up{training_job=...} == 0` visible until the directory is cleaned.

The address is the host name (`socket.getfqdn()`) unless `TRAINPROF_FILE_SD_ADDRESS` names
the address Prometheus should use. Writes are atomic (temporary file, then rename), so
Prometheus never reads half a file.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
from collections.abc import Mapping

from trainprof.contract.names import JOB_LABEL

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def target_path(directory: str, labels: Mapping[str, str]) -> str:
    """`<dir>/<training_job>.rank<rank>.json`, the job name made safe for a file name.

    >>> target_path("/sd", {"training_job": "bert/large run", "rank": "3"})
    '/sd/bert_large_run.rank3.json'
    """
    job = _UNSAFE.sub("_", labels.get(JOB_LABEL) or "training")
    rank = _UNSAFE.sub("_", labels.get("rank", "0"))
    return os.path.join(directory, f"{job}.rank{rank}.json")


def target(address: str, port: int, labels: Mapping[str, str]) -> list[dict]:
    host = f"[{address}]" if ":" in address and not address.startswith("[") else address
    return [{"targets": [f"{host}:{port}"], "labels": dict(labels)}]


def write(directory: str, port: int, labels: Mapping[str, str], address: str | None = None) -> str:
    """Write this rank's target file atomically; its path."""
    address = address or os.environ.get("TRAINPROF_FILE_SD_ADDRESS") or socket.getfqdn()
    path = target_path(directory, labels)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".trainprof-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(target(address, port, labels), f)
            f.write("\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

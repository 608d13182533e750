"""SLURM / bare metal: ranks announce themselves as file_sd targets, and a real Prometheus
using docs/scrape/file-sd.yml stores their series with the job's identity once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from trainprof.deploy import file_sd
from trainprof.engines.localstack import prometheus, stop_process

from servers import query, wait_for_targets

HERE = Path(__file__).resolve().parent
SLURM = {"SLURM_JOB_NAME": "bert", "SLURM_JOB_ID": "42", "SLURMD_NODENAME": "gpu-node-07"}


def _rank(env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KUBERNETES_SERVICE_HOST", "RANK", "LOCAL_RANK", "TRAINPROF_JOB")
    }
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "live_rank.py"), "-", "-", "-", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env={**clean, **env},
    )
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        stop_process(proc)
        raise RuntimeError(f"rank did not start: {line!r}")
    return proc, int(line)


def test_target_file_names_and_content(tmp_path):
    labels = {"training_job": "bert-42", "node": "n7", "rank": "3", "local_rank": "1"}
    path = file_sd.write(str(tmp_path / "sd"), 9947, labels, address="10.0.0.7")
    assert path == str(tmp_path / "sd" / "bert-42.rank3.json")
    assert json.loads(Path(path).read_text()) == [{"targets": ["10.0.0.7:9947"], "labels": labels}]
    assert os.listdir(tmp_path / "sd") == ["bert-42.rank3.json"]  # no temporary left over
    assert file_sd.target("fe80::1", 9946, {})[0]["targets"] == ["[fe80::1]:9946"]
    file_sd.remove(path)
    file_sd.remove(path)  # already gone: fine
    assert not os.listdir(tmp_path / "sd")


def test_a_rank_writes_its_target_and_removes_it_on_stop(tmp_path):
    script = (
        "import os, trainprof\n"
        "s = trainprof.start(port=0, addr='127.0.0.1')\n"
        "d = os.environ['TRAINPROF_FILE_SD_DIR']\n"
        "print(sorted(os.listdir(d)), s.port, flush=True)\n"
        "trainprof.stop()\n"
        "print(sorted(os.listdir(d)), flush=True)\n"
    )
    env = {
        **{k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"},
        **SLURM,
        "SLURM_PROCID": "5",
        "TRAINPROF_FILE_SD_DIR": str(tmp_path),
        "TRAINPROF_FILE_SD_ADDRESS": "127.0.0.1",
    }
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()
    assert first.startswith("['bert-42.rank5.json']")
    assert second == "[]"


def test_an_unwritable_directory_is_one_warning_not_an_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    script = (
        "import trainprof\n"
        "s = trainprof.start(port=0, addr='127.0.0.1')\n"
        "with trainprof.step(): pass\n"
        "print(s.port is not None)\n"
    )
    env = {**os.environ, "TRAINPROF_FILE_SD_DIR": str(blocker / "sd")}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr
    assert "cannot write the file_sd target" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.fixture
def slurm_job(prometheus_bin, root, tmp_path):
    sd = tmp_path / "sd"
    procs = []
    try:
        for rank in (0, 1):
            proc, _ = _rank(
                {
                    **SLURM,
                    "SLURM_PROCID": str(rank),
                    "SLURM_LOCALID": str(rank),
                    "TRAINPROF_FILE_SD_DIR": str(sd),
                    "TRAINPROF_FILE_SD_ADDRESS": "127.0.0.1",
                }
            )
            procs.append(proc)
        config = yaml.safe_load((root / "docs" / "scrape" / "file-sd.yml").read_text())
        jobs = config["scrape_configs"]
        (ranks,) = [j for j in jobs if j["job_name"] == "trainprof-ranks"]
        ranks["file_sd_configs"][0]["files"] = [str(sd / "*.json")]
        config = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [ranks],
        }
        with prometheus(prometheus_bin, tmp_path, yaml.safe_dump(config), {}) as base:
            wait_for_targets(base, 2)
            yield base
    finally:
        for proc in procs:
            stop_process(proc)
            proc.stdout.close()


def test_prometheus_finds_every_rank_with_its_job(slurm_job):
    base = slurm_job
    deadline = time.monotonic() + 20
    while True:
        result = query(base, 'trainprof_training_steps_total{mode="train"}')["data"]["result"]
        if len(result) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    series = [r["metric"] for r in result]
    assert sorted(s["rank"] for s in series) == ["0", "1"], series
    for labels in series:
        assert labels["training_job"] == "bert-42"
        assert labels["node"] == "gpu-node-07"
        assert not [k for k in labels if k.startswith("exported_")], labels
    ups = query(base, 'up{training_job="bert-42"} == 1')["data"]["result"]
    assert sorted(u["metric"]["rank"] for u in ups) == ["0", "1"]

"""Several processes: forked DataLoader workers, two ranks on one node, a restarted rank."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import trainprof
from conftest import require_module

torch = require_module("torch")


def scrape(port: int) -> list:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def value(samples, name: str, **labels: str) -> float | None:
    for s in samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rank exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            scrape(port)
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing served on {port}")


def free_ports(n: int) -> int:
    """A base port with n free consecutive ports after it."""
    for base in range(41_000, 60_000, 53):
        socks = []
        try:
            for i in range(n):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", base + i))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return base
    raise RuntimeError("no free ports")


class WorkerDataset(torch.utils.data.Dataset):
    """Each item tries, inside a forked worker, to record, start and serve."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        session = trainprof.start(port=0, addr="127.0.0.1")  # must refuse in a worker
        with trainprof.step():
            with trainprof.phase("decode"):
                pass
        trainprof.add(samples=1000)
        return torch.tensor([i, os.getpid(), session.port or 0, int(session.inert)])


@pytest.fixture(autouse=True)
def fresh_session():
    trainprof.stop()
    yield
    trainprof.stop()


def test_forked_dataloader_workers_neither_serve_nor_change_the_ranks_metrics():
    session = trainprof.start(port=0, addr="127.0.0.1")
    port = session.port
    loader = torch.utils.data.DataLoader(
        WorkerDataset(),
        batch_size=2,
        num_workers=2,
        multiprocessing_context="fork",
        persistent_workers=True,
    )
    items = []
    for batch in trainprof.data(loader):
        with trainprof.step(samples=len(batch)):
            items.append(batch)
    rows = torch.cat(items)
    assert set(rows[:, 1].tolist()).isdisjoint({os.getpid()})  # really ran in workers
    assert rows[:, 2].tolist() == [0] * 8  # no worker served
    assert rows[:, 3].tolist() == [1] * 8  # all were inert

    samples = scrape(port)
    assert value(samples, "trainprof_training_steps_total", mode="train") == 4
    assert value(samples, "trainprof_training_samples_total") == 8
    assert value(samples, "trainprof_training_phase_seconds_total", phase="decode") is None
    assert value(samples, "trainprof_training_phase_seconds_total", phase="dataloader") > 0
    assert value(samples, "trainprof_instrumentation_errors_total") == 0

    # The workers are still alive (persistent); they closed their copy of the listening
    # socket, so the port is free again as soon as the rank stops serving.
    assert all(w.is_alive() for w in loader._iterator._workers)
    trainprof.stop()
    with socket.socket() as probe:
        # SO_REUSEADDR as the HTTP server sets it: TIME_WAIT of the scrapes does not block
        # the bind, a listening socket left open in a worker would.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
        probe.listen()
    del loader


RANK_SCRIPT = textwrap.dedent("""
    import sys, time
    import trainprof
    trainprof.start(addr="127.0.0.1")
    steps = int(sys.argv[1])
    for i in range(steps):
        with trainprof.step(samples=4):
            with trainprof.phase("forward"):
                time.sleep(0.001)
    print("ready", flush=True)
    time.sleep(120)
""")


def start_rank(base: int, rank: int, local_rank: int, steps: int, tmp_path) -> subprocess.Popen:
    env = {
        **os.environ,
        "TRAINPROF_BASE_PORT": str(base),
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "0",
        "TRAINPROF_JOB": "two-ranks",
    }
    env.pop("KUBERNETES_SERVICE_HOST", None)
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    return subprocess.Popen(
        [sys.executable, str(script), str(steps)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready(proc: subprocess.Popen) -> None:
    line = proc.stdout.readline()
    assert line.strip() == "ready", proc.stderr.read()


def test_two_ranks_on_one_node_serve_on_base_plus_local_rank(tmp_path):
    base = free_ports(2)
    procs = [start_rank(base, 0, 0, 3, tmp_path), start_rank(base, 1, 1, 5, tmp_path)]
    try:
        for proc in procs:
            wait_ready(proc)
        for local_rank, steps in ((0, 3), (1, 5)):
            samples = scrape(base + local_rank)
            assert (
                value(
                    samples,
                    "trainprof_training_steps_total",
                    training_job="two-ranks",
                    rank=str(local_rank),
                    local_rank=str(local_rank),
                )
                == steps
            )
            assert value(samples, "trainprof_training_info", world_size="2", node_rank="0") == 1
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()


def test_a_restarted_rank_takes_its_port_back_and_counts_from_zero(tmp_path):
    base = free_ports(1)
    first = start_rank(base, 0, 0, 7, tmp_path)
    try:
        wait_ready(first)
        assert value(scrape(base), "trainprof_training_steps_total") == 7
        started = value(scrape(base), "trainprof_training_start_timestamp_seconds")
    finally:
        first.kill()
        first.wait()
        first.stdout.close()
        first.stderr.close()
    second = start_rank(base, 0, 0, 2, tmp_path)
    try:
        wait_ready(second)
        samples = scrape(base)
        assert value(samples, "trainprof_training_steps_total") == 2
        assert value(samples, "trainprof_training_start_timestamp_seconds") > started
    finally:
        second.kill()
        second.wait()
        second.stdout.close()
        second.stderr.close()


def test_the_plain_pytorch_example_runs(root):
    base = free_ports(1)
    env = {**os.environ, "TRAINPROF_BASE_PORT": str(base)}
    for var in ("RANK", "LOCAL_RANK", "KUBERNETES_SERVICE_HOST"):
        env.pop(var, None)
    out = subprocess.run(
        [sys.executable, str(root / "examples" / "pytorch_loop.py"), "--steps", "20"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert f"metrics on port {base}" in out.stdout
    assert "20 steps" in out.stdout

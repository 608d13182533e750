"""`trainprof.start(system_metrics=True)` runs the system exporter on local rank 0."""

from __future__ import annotations

import logging
import socket
import time
import urllib.request

import pytest

import trainprof


@pytest.fixture(autouse=True)
def fresh_session():
    trainprof.stop()
    yield
    trainprof.stop()


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def test_local_rank_0_serves_host_samples_beside_its_own_metrics(monkeypatch):
    monkeypatch.setenv("TRAINPROF_EXPORTER_PORT", "0")
    session = trainprof.start(
        port=0, local_rank=0, rank=0, training_job="bert", node="n1", system_metrics=True
    )
    assert session.system is not None
    deadline = time.monotonic() + 10
    while (
        "trainprof_samples_total" not in (text := _scrape(session.system.url))
        or 'trainprof_samples_total{node="n1",training_job="bert"} 0.0' in text
    ):
        assert time.monotonic() < deadline, text[:500]
        time.sleep(0.2)
    assert 'trainprof_cpu_utilization_sampled_ratio_count{node="n1",training_job="bert"}' in text
    url = session.system.url
    trainprof.stop()
    with pytest.raises(OSError):
        _scrape(url)


def test_other_local_ranks_do_not_start_it(monkeypatch):
    monkeypatch.setenv("TRAINPROF_EXPORTER_PORT", "0")
    session = trainprof.start(port=0, local_rank=1, rank=1, system_metrics=True)
    assert session.system is None


def test_a_taken_exporter_port_is_one_warning_and_training_goes_on(monkeypatch, caplog):
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        monkeypatch.setenv("TRAINPROF_EXPORTER_PORT", str(taken.getsockname()[1]))
        with caplog.at_level(logging.WARNING, logger="trainprof"):
            session = trainprof.start(port=0, local_rank=0, system_metrics=True)
        assert session.system is None
        assert any("system exporter not started" in r.getMessage() for r in caplog.records)
        with trainprof.step():
            pass
        assert session.started

"""The running exporter over HTTP: negotiation, keep-alive, slow and half-open clients, a
port already in use, TLS and basic auth from the web configuration, and in-process use."""

from __future__ import annotations

import base64
import gzip
import http.client
import socket
import ssl
import subprocess
import sys
import threading

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.parser import text_string_to_metric_families

import trainprof.exporter
from trainprof.exporter import webconfig
from trainprof.exporter.sources.gpu import GpuSource

from fakes import FakeNvml, ScriptedCpu, h100s

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def fake_sources():
    return [GpuSource(FakeNvml(h100s(2))), ScriptedCpu([([0.9, 0.1], [0.0, 0.2])])]


def start(port=0, **kwargs):
    options = dict(
        address="127.0.0.1",
        sources=fake_sources(),
        identity={"node": "n1"},
        datapoint_interval=0.05,
    )
    options.update(kwargs)
    return trainprof.exporter.start(port, **options)


def get(port, path="/metrics", headers=None, method="GET", context=None):
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def trainprof_threads() -> int:
    return sum(t.name.startswith("trainprof-") for t in threading.enumerate())


def wait_for_samples(exporter, n=2):
    import time

    deadline = time.monotonic() + 10
    while exporter.sampler.samples < n:
        assert time.monotonic() < deadline, "the sampler took no samples"
        time.sleep(0.02)


@pytest.fixture
def exporter():
    running = start()
    wait_for_samples(running)
    yield running
    running.stop()


def test_prometheus_gets_gzipped_openmetrics(exporter):
    status, headers, body = get(
        exporter.port, headers={"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
    )
    assert status == 200
    assert headers["Content-Type"] == "application/openmetrics-text; version=1.0.0; charset=utf-8"
    assert headers["Content-Encoding"] == "gzip"
    text = gzip.decompress(body).decode()
    assert text.endswith("# EOF\n")
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {
        "trainprof_samples",
        "trainprof_gpu_utilization_sampled_ratio",
        "trainprof_collector_success",
    } <= names


def test_other_clients_get_the_text_format(exporter):
    status, headers, body = get(exporter.port)
    assert status == 200 and "Content-Encoding" not in headers
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert b'trainprof_collector_success{collector="gpu",node="n1"} 1.0' in body


def test_head_landing_page_and_unknown_paths(exporter):
    status, headers, body = get(exporter.port, method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 1000
    status, _, body = get(exporter.port, "/")
    assert status == 200 and b'<a href="/metrics">' in body
    assert get(exporter.port, "/nope")[0] == 404
    assert exporter.url == f"http://127.0.0.1:{exporter.port}/metrics"


def test_one_connection_serves_many_scrapes(exporter):
    conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=10)
    try:
        for _ in range(3):
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            assert response.status == 200 and response.read()
    finally:
        conn.close()


def test_half_open_and_dribbling_clients_do_not_stall_other_scrapes(exporter):
    silent = socket.create_connection(("127.0.0.1", exporter.port))
    dribbling = socket.create_connection(("127.0.0.1", exporter.port))
    dribbling.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # headers never finished
    never_reads = socket.create_connection(("127.0.0.1", exporter.port))
    never_reads.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    never_reads.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 50)
    try:
        for _ in range(5):
            assert get(exporter.port)[0] == 200
    finally:
        for s in (silent, dribbling, never_reads):
            s.close()


def test_connections_beyond_the_maximum_take_the_slot_of_one_that_sends_nothing():
    running = start(max_connections=2)
    try:
        idle = [socket.create_connection(("127.0.0.1", running.port)) for _ in range(2)]
        status, _, body = get(running.port)
        assert status == 200 and b"trainprof_samples_total" in body
        idle[0].settimeout(10)
        assert idle[0].recv(10) == b"", "the oldest idle connection was closed for it"
        for s in idle:
            s.close()
    finally:
        running.stop()


def test_a_port_in_use_is_a_clear_error_and_nothing_keeps_running(exporter):
    before = trainprof_threads()
    with pytest.raises(OSError) as raised:
        start(port=exporter.port)
    assert raised.value.strerror == (
        f"cannot listen on 127.0.0.1:{exporter.port}: Address already in use"
    )
    assert trainprof_threads() == before


def test_the_cli_exits_1_on_a_port_in_use_without_a_traceback(exporter):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainprof.cli",
            "exporter",
            "--no-collector.gpu",
            "--web.listen-address",
            f"127.0.0.1:{exporter.port}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert (
        f"error: cannot listen on 127.0.0.1:{exporter.port}: Address already in use"
        in result.stderr
    )
    assert "Traceback" not in result.stderr


# --- in-process -------------------------------------------------------------------------


def test_in_process_the_series_join_the_given_registry_until_stopped():
    registry = CollectorRegistry(auto_describe=True)
    running = trainprof.exporter.start(
        None,
        registry=registry,
        sources=fake_sources(),
        identity={"node": "n1"},
        datapoint_interval=0.05,
    )
    try:
        assert running.url is None
        wait_for_samples(running, 3)
        assert registry.get_sample_value("trainprof_samples_total", {"node": "n1"}) >= 3
        assert (
            registry.get_sample_value(
                "trainprof_gpu_utilization_ratio",
                {"node": "n1", "gpu": "1", "uuid": "GPU-00000001-1f2e-4d3c-8b7a-000000000001"},
            )
            == 0.5
        )
    finally:
        running.stop()
    assert registry.get_sample_value("trainprof_samples_total", {"node": "n1"}) is None


def test_identity_labels_that_belong_to_the_target_are_refused():
    with pytest.raises(ValueError, match="identity label job is not one of training_job, node"):
        trainprof.exporter.start(None, sources=fake_sources(), identity={"job": "bert"})


def test_a_registry_that_already_has_these_names_is_refused_and_nothing_runs():
    registry = CollectorRegistry(auto_describe=True)
    first = trainprof.exporter.start(None, registry=registry, sources=fake_sources())
    try:
        before = trainprof_threads()
        with pytest.raises(ValueError, match="Duplicated timeseries"):
            trainprof.exporter.start(None, registry=registry, sources=fake_sources())
        assert trainprof_threads() == before
    finally:
        first.stop()


def test_a_rule_configuration_adds_its_thresholds_and_sets_the_interval(tmp_path):
    config = tmp_path / "rules.yaml"
    config.write_text(
        "datapoint_interval: 0.25s\nrules:\n  - rule: CPUBottleneck\n"
        "    parameters: {cpu_threshold: 85, gpu_threshold: 15}\n"
    )
    running = start(rules_config=str(config), datapoint_interval=None)
    try:
        wait_for_samples(running)
        body = get(running.port)[2]
        assert b'trainprof_sampler_interval_seconds{node="n1"} 0.25' in body
        assert b'trainprof_cpu_bottleneck_samples_total{cpu_above="0.85",gpu_below="0.15"' in body
    finally:
        running.stop()
    with pytest.raises(
        ValueError,
        match="datapoint interval 0.5s disagrees with .*rules.yaml's datapoint_interval 0.25s",
    ):
        start(rules_config=str(config), datapoint_interval=0.5)


# --- TLS and basic auth ----------------------------------------------------------------


@pytest.fixture(scope="module")
def certificate(tmp_path_factory, openssl):
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            str(d / "server.key"),
            "-out",
            str(d / "server.crt"),
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return d


def test_tls_from_the_web_config_and_a_client_that_never_handshakes(certificate):
    config = certificate / "web.yml"
    config.write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
        "http_server_config:\n  headers: {X-Frame-Options: deny}\n"
    )
    running = start(web=webconfig.load(str(config)))
    client = ssl.create_default_context(cafile=str(certificate / "server.crt"))
    stalled = socket.create_connection(("127.0.0.1", running.port))  # no ClientHello
    try:
        status, headers, body = get(running.port, context=client)
        assert status == 200 and b"trainprof_samples_total" in body
        assert headers["X-Frame-Options"] == "deny"
        assert running.url.startswith("https://127.0.0.1:")
        plain = http.client.HTTPConnection("127.0.0.1", running.port, timeout=10)
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            plain.request("GET", "/metrics")
            plain.getresponse().read()
        plain.close()
        assert get(running.port, context=client)[0] == 200
    finally:
        stalled.close()
        running.stop()


def test_basic_auth_checks_each_password_once_and_refuses_the_rest():
    checks = []

    def check(password: bytes, hashed: bytes) -> bool:
        checks.append(password)
        return hashed == b"$2y$10$" + password.ljust(53, b".")

    web = webconfig.parse(
        {"basic_auth_users": {"prometheus": "$2y$10$" + "s3cret".ljust(53, ".")}},
        check_password=check,
    )
    running = start(web=web)
    auth = lambda user, pw: {
        "Authorization": "Basic "  # noqa: E731
        + base64.b64encode(f"{user}:{pw}".encode()).decode()
    }
    try:
        for _ in range(3):
            assert get(running.port, headers=auth("prometheus", "s3cret"))[0] == 200
        assert checks == [b"s3cret"], "a verified password is remembered"
        status, headers, _ = get(running.port)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
        assert get(running.port, headers=auth("prometheus", "guess"))[0] == 401
        assert get(running.port, headers=auth("root", "s3cret"))[0] == 401
        assert get(running.port, headers={"Authorization": "Basic %%%"})[0] == 401
        assert get(running.port, "/", headers=auth("prometheus", "guess"))[0] == 401
    finally:
        running.stop()


def test_a_web_config_lists_every_problem_with_its_path(tmp_path):
    with pytest.raises(webconfig.WebConfigError) as raised:
        webconfig.parse(
            {
                "tls_server_config": {
                    "cert_file": "nope.crt",
                    "client_auth_type": "Maybe",
                    "cipher_suites": ["x"],
                    "min_verison": "TLS12",
                },
                "basic_auth_users": {"alice": "plaintext"},
                "http_server_config": {"http2": True},
                "basic_auth_user": {},
            },
            str(tmp_path / "web.yml"),
        )
    message = str(raised.value)
    for expected in (
        "basic_auth_user: unknown key (did you mean basic_auth_users?)",
        "tls_server_config.cipher_suites: not implemented by trainprof exporter",
        "tls_server_config.min_verison: unknown key (did you mean min_version?)",
        "tls_server_config.key_file: required for TLS",
        "tls_server_config.client_auth_type: 'Maybe' is not one of NoClientCert",
        "basic_auth_users.alice: not a bcrypt hash",
    ):
        assert expected in message
    assert "http2" not in message


def test_unreadable_certificates_and_bad_yaml_name_the_file(tmp_path):
    with pytest.raises(webconfig.WebConfigError, match="cannot load .*nope.crt"):
        webconfig.parse({"tls_server_config": {"cert_file": "nope.crt", "key_file": "nope.key"}})
    bad = tmp_path / "web.yml"
    bad.write_text("tls_server_config: [\n")
    with pytest.raises(
        webconfig.WebConfigError, match=r"web.yml: line 2, column 1: not valid YAML"
    ):
        webconfig.load(str(bad))
    with pytest.raises(webconfig.WebConfigError, match="missing.yml: cannot read"):
        webconfig.load(str(tmp_path / "missing.yml"))


def test_basic_auth_without_bcrypt_refuses_to_start(monkeypatch):
    monkeypatch.setitem(sys.modules, "bcrypt", None)
    with pytest.raises(
        webconfig.BcryptMissing,
        match=r"needs bcrypt, which is not installed: pip install 'trainprof\[exporter\]'",
    ):
        webconfig.parse({"basic_auth_users": {"prometheus": "$2y$10$" + "a" * 53}})

"""The Prometheus API client (`engines.prometheus_api`) against a real Prometheus that serves
TLS from its own web config and asks for a client certificate, as a hardened server does: the
CA, the client certificate and skipping verification each do what they say, and what fails is
one sentence that says whose mistake it is (`bad_input`: exit 2 from `trainprof report`)."""

from __future__ import annotations

import contextlib
import ssl
import subprocess
import sys
import time
import urllib.request

import pytest

from trainprof.engines.localstack import free_port, stop_process
from trainprof.engines.prometheus_api import PrometheusAPI, PrometheusAPIError, read_access


def _openssl(openssl: str, *args: str) -> None:
    subprocess.run([openssl, *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory, openssl):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by it;
    the client key also encrypted."""
    d = tmp_path_factory.mktemp("pki")
    _openssl(
        openssl,
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test CA"),
        *("-keyout", str(d / "ca.key"), "-out", str(d / "ca.crt")),
    )
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl(
            openssl,
            *("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}"),
            *("-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr")),
        )
        _openssl(
            openssl,
            *("x509", "-req", "-in", str(d / f"{name}.csr"), "-days", "2"),
            *("-CA", str(d / "ca.crt"), "-CAkey", str(d / "ca.key"), "-CAcreateserial"),
            *("-extfile", str(d / f"{name}.ext"), "-out", str(d / f"{name}.crt")),
        )
    _openssl(
        openssl,
        *("pkey", "-in", str(d / "client.key"), "-aes256", "-passout", "pass:hunter2"),
        *("-out", str(d / "client-encrypted.key")),
    )
    return d


@pytest.fixture(scope="module")
def tls_prometheus(pki, prometheus_bin, tmp_path_factory):
    """Prometheus on https://127.0.0.1:PORT, requiring a client certificate from the CA."""
    d = tmp_path_factory.mktemp("tls-prometheus")
    (d / "prometheus.yml").write_text("global: {}\n")
    (d / "web.yml").write_text(
        "tls_server_config:\n"
        f"  cert_file: {pki / 'server.crt'}\n"
        f"  key_file: {pki / 'server.key'}\n"
        "  client_auth_type: RequireAndVerifyClientCert\n"
        f"  client_ca_file: {pki / 'ca.crt'}\n"
    )
    port = free_port()
    log = open(d / "prometheus.log", "w")
    proc = subprocess.Popen(
        [
            prometheus_bin,
            f"--config.file={d / 'prometheus.yml'}",
            f"--storage.tsdb.path={d / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--web.config.file={d / 'web.yml'}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"https://127.0.0.1:{port}"
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (d / "prometheus.log").read_text()
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{base}/-/ready", timeout=1, context=context) as r:
                    if r.status == 200:
                        break
            assert time.monotonic() < deadline, "Prometheus with TLS did not become ready"
            time.sleep(0.1)
        yield base
    finally:
        stop_process(proc)
        log.close()


def test_the_ca_and_the_client_certificate_reach_prometheus(tls_prometheus, pki):
    access = read_access(
        ca_file=str(pki / "ca.crt"),
        cert_file=str(pki / "client.crt"),
        key_file=str(pki / "client.key"),
    )
    api = PrometheusAPI(tls_prometheus, access=access)
    assert api.instant("1 + 1", 1000.0) == [({}, [(1000.0, 2.0)])]
    assert api.range("vector(3)", 1000.0, 1060.0, 30.0) == [
        ({}, [(t, 3.0) for t in (1000.0, 1030.0, 1060.0)])
    ]


def test_skipping_verification_still_sends_the_client_certificate(tls_prometheus, pki):
    access = read_access(
        cert_file=str(pki / "client.crt"),
        key_file=str(pki / "client.key"),
        insecure_skip_verify=True,
    )
    assert PrometheusAPI(tls_prometheus, access=access).query("2")["result"][1] == "2"


@pytest.mark.parametrize(
    "options, message",
    [
        # The system's CAs do not know the test CA.
        ({"cert_file": "client.crt", "key_file": "client.key"}, "CERTIFICATE_VERIFY_FAILED"),
        # The server asks for a certificate the client does not send.
        ({"ca_file": "ca.crt"}, ""),
    ],
)
def test_a_refused_handshake_is_a_failure_naming_the_server(tls_prometheus, pki, options, message):
    access = read_access(**{k: str(pki / v) for k, v in options.items()})
    with pytest.raises(PrometheusAPIError, match=f"cannot reach Prometheus at {tls_prometheus}: "):
        try:
            PrometheusAPI(tls_prometheus, access=access).query("1")
        except PrometheusAPIError as e:
            assert message in str(e) and not e.bad_input, e
            raise


@pytest.mark.parametrize(
    "options, message",
    [
        ({"ca_file": "server.key"}, "TLS options: "),
        ({"ca_file": "missing.crt"}, "TLS options: No such file or directory"),
        (
            {"cert_file": "client.crt", "key_file": "client-encrypted.key"},
            "TLS options: the client key is encrypted; give an unencrypted key file",
        ),
    ],
)
def test_unusable_tls_files_are_the_users_mistake(tls_prometheus, pki, options, message):
    access = read_access(**{k: str(pki / v) for k, v in options.items()})
    with pytest.raises(PrometheusAPIError, match=message) as raised:
        PrometheusAPI(tls_prometheus, access=access)
    assert raised.value.bad_input


def test_the_report_exits_2_on_unusable_tls_files(tls_prometheus, pki, tmp_path):
    result = subprocess.run(
        [
            *(sys.executable, "-m", "trainprof.cli", "report"),
            *("--prometheus", tls_prometheus, "--job", "x", "-o", str(tmp_path / "r.html")),
            *("--ca-file", str(pki / "server.key")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "error: TLS options: " in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_query_prometheus_refuses_is_its_sentence_and_the_query(tls_prometheus, pki):
    access = read_access(
        ca_file=str(pki / "ca.crt"),
        cert_file=str(pki / "client.crt"),
        key_file=str(pki / "client.key"),
    )
    with pytest.raises(PrometheusAPIError) as raised:
        PrometheusAPI(tls_prometheus, access=access).instant("sum(", 1000.0)
    assert str(raised.value).startswith(f"Prometheus at {tls_prometheus} rejected a query: ")
    assert "parse error" in str(raised.value) and str(raised.value).endswith("\nsum(")
    assert not raised.value.bad_input

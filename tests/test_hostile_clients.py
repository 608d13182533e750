"""Hostile and heavy clients against every port trainprof opens, on 127.0.0.1 only: slow-loris
connections, connection floods, a response split over two writes (Nagle), request smuggling
with two Content-Lengths, password guessing and user enumeration, secrets in query strings.

Each test is bounded in time: header deadlines are shortened where a test waits for one.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import socketserver
import subprocess
import sys
import threading
import time

import pytest

import trainprof
from test_exporter_server import get, start
from trainprof.actions.audit import history
from trainprof.actions.config import load_actions_config
from trainprof.contract import httpserve
from trainprof.exporter import webconfig

from servers import actions_receiver, wait_for
from webhook import TOKEN, payload, post

BASE = {
    "token_env": "UNUSED_IN_TESTS",
    "allow": {"namespaces": ["team-a"], "training_jobs": ["starved", "bert-.*"]},
    "rules": {"CPUBottleneck": "stop"},
    "local": {"jobs": {"starved": {"pid_file": "/nonexistent/starved.pid"}}},
}


def actions_config(**changes):
    return load_actions_config({**BASE, **changes})


def slow_clients(port: int, n: int, first: bytes = b"G") -> list[socket.socket]:
    """`n` slow-loris connections: each sends `first` and then nothing more (and has been
    connected for half a second when this returns, as an attack's connections have)."""
    clients = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if first:
            s.sendall(first)
        clients.append(s)
    time.sleep(0.5)
    return clients


def close_all(clients) -> None:
    for s in clients:
        s.close()


@pytest.fixture
def count_writes(monkeypatch):
    """The writes servers make to client sockets, as (server port, bytes): other tests' servers
    still running in this process write too, so a test counts only its own port's."""
    writes: list[tuple[int, int]] = []
    original = socketserver._SocketWriter.write

    def write(self, b):
        try:
            port = self._sock.getsockname()[1]
        except OSError:  # a socket already closed: not one of the test's
            port = -1
        writes.append((port, len(b)))
        return original(self, b)

    monkeypatch.setattr(socketserver._SocketWriter, "write", write)
    return writes


def writes_to(writes: list[tuple[int, int]], port: int) -> list[int]:
    return [n for p, n in writes if p == port]


# --- Nagle: one write per response -----------------------------------------------------------


def test_exporter_answers_each_kept_alive_scrape_in_one_write(count_writes):
    running = start()
    port = running.port
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for _ in range(3):
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            assert response.status == 200 and response.read()
        conn.close()
    finally:
        running.stop()
    mine = writes_to(count_writes, port)
    assert len(mine) == 3, f"writes per response: {mine}"


def test_a_rank_answers_each_kept_alive_scrape_in_one_write(count_writes):
    session = trainprof.start(port=0, addr="127.0.0.1", training_job="nagle")
    port = session.port
    try:
        with trainprof.step():
            pass
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for _ in range(3):
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            assert response.status == 200 and b"trainprof_training_steps" in response.read()
        conn.close()
    finally:
        trainprof.stop()
    mine = writes_to(count_writes, port)
    assert len(mine) == 3, f"writes per response: {mine}"


# --- slow loris --------------------------------------------------------------------------------


def test_slow_loris_connections_do_not_take_the_exporters_slots():
    running = start(max_connections=8)
    clients = slow_clients(running.port, 24)  # three times the cap, none sends its headers
    try:
        for _ in range(3):
            status, _, body = get(running.port)
            assert status == 200 and b"trainprof_samples_total" in body
    finally:
        close_all(clients)
        running.stop()


def test_a_connection_that_never_sends_its_headers_is_closed_at_the_deadline():
    class Hello(httpserve.Handler):
        def do_GET(self):
            self.respond(200, b"hello\n", "text/plain")

    server = httpserve.Server(
        httpserve.listen("127.0.0.1", 0),
        Hello,
        name="test",
        limits=httpserve.Limits(max_connections=4, header_timeout=0.5),
    )
    server.start()
    try:
        [dripping] = slow_clients(server.address[1], 1, b"GET / HTTP/1.1\r\n")
        started = time.monotonic()
        dripping.settimeout(10)
        try:
            for _ in range(20):  # one header line every 0.2 s: never finished in time
                dripping.sendall(b"X-Drip: 1\r\n")
                time.sleep(0.2)
            closed = False
        except OSError:
            closed = True
        if not closed:
            closed = dripping.recv(100) in (b"",)
        assert closed, "a dripping client kept its connection past the header deadline"
        assert time.monotonic() - started < 5
        dripping.close()
    finally:
        server.stop()


def test_busy_connections_over_the_cap_are_refused_with_503():
    release = threading.Event()

    class Slow(httpserve.Handler):
        def do_GET(self):
            release.wait(10)
            self.respond(200, b"done\n", "text/plain")

    server = httpserve.Server(
        httpserve.listen("127.0.0.1", 0),
        Slow,
        name="test",
        limits=httpserve.Limits(max_connections=2),
    )
    server.start()
    port = server.address[1]
    busy = []
    try:
        for _ in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/")
            busy.append(conn)
        wait_for(
            lambda: (
                server._connections
                and all(c.state == "busy" for c in server._connections.values())
                and len(server._connections) == 2
            ),
            10,
            "two requests in progress",
        )
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/")
        assert conn.getresponse().status == 503
        conn.close()
        release.set()
        for conn in busy:
            assert conn.getresponse().status == 200
            conn.close()
    finally:
        release.set()
        server.stop()


def test_without_refusals_a_connection_over_a_busy_cap_waits_its_turn():
    release = threading.Event()

    class Slow(httpserve.Handler):
        def do_GET(self):
            release.wait(10)
            self.respond(200, b"done\n", "text/plain")

    limits = httpserve.Limits(max_connections=2, refuse_when_busy=False)
    server = httpserve.Server(httpserve.listen("127.0.0.1", 0), Slow, name="test", limits=limits)
    server.start()
    port = server.address[1]
    conns = []
    try:
        for _ in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/")
            conns.append(conn)
        wait_for(
            lambda: [c.state for c in server._connections.values()] == ["busy", "busy"],
            10,
            "two requests in progress",
        )
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/")
        conns.append(conn)
        time.sleep(0.5)
        assert len(server._connections) == 2, "the third connection was accepted anyway"
        release.set()
        assert [c.getresponse().status for c in conns] == [200, 200, 200]
    finally:
        release.set()
        for c in conns:
            c.close()
        server.stop()


def test_slow_loris_connections_do_not_block_alertmanagers_deliveries(tmp_path, monkeypatch):
    from trainprof.actions import server

    monkeypatch.setattr(server, "MAX_CONNECTIONS", 8)
    with actions_receiver(actions_config(), TOKEN, tmp_path / "audit.jsonl") as (url, _):
        port = int(url.rsplit(":", 1)[1])
        clients = slow_clients(port, 24, b"POST /alerts HTTP/1.1\r\n")
        try:
            status, _, body = post(url, payload())
            assert status == 200
            assert body["decisions"][0]["decision"] == "would_stop"
        finally:
            close_all(clients)


def test_a_rank_caps_its_connections_and_closes_silent_ones(monkeypatch):
    from trainprof.training import rank_server

    monkeypatch.setattr(rank_server, "HEADER_TIMEOUT", 0.5)
    session = trainprof.start(port=0, addr="127.0.0.1", training_job="loris")
    before = threading.active_count()
    clients = slow_clients(session.port, 60, b"")
    try:
        time.sleep(0.3)
        assert threading.active_count() - before <= rank_server.MAX_CONNECTIONS
        status, _, body = get(session.port)
        assert status == 200 and b"trainprof_training_steps" in body
        for s in clients:
            s.settimeout(5)
        # Every silent connection is closed by the rank (evicted or past its deadline).
        assert all(s.recv(10) == b"" for s in clients)
    finally:
        close_all(clients)
        trainprof.stop()


# --- request smuggling, secrets in logs, audit floods --------------------------------------


def test_two_content_length_headers_are_refused(tmp_path):
    audit = tmp_path / "audit.jsonl"
    body = json.dumps(payload()).encode()
    with actions_receiver(actions_config(), TOKEN, audit) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(
                b"POST /alerts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {TOKEN}\r\n".encode()
                + f"Content-Length: {len(body)}\r\nContent-Length: 2\r\n\r\n".encode()
                + body
            )
            answer = s.recv(200)
    assert answer.startswith(b"HTTP/1.1 400"), answer
    assert not [r for r in history(str(audit)) if r["event"] == "decision"]


def test_a_token_in_the_query_string_never_reaches_the_audit_log(tmp_path):
    audit = tmp_path / "audit.jsonl"
    secret = "tok-" + "q" * 30
    with actions_receiver(actions_config(), TOKEN, audit) as (url, _):
        post(url, payload(), token=None, path=f"/alerts?token={secret}")
        post(url, payload(), token=None, path=f"/elsewhere?access_token={secret}")
    text = audit.read_text()
    assert secret not in text
    assert "(query not logged)" in text


def test_unauthenticated_floods_are_rate_limited_before_the_audit_log(tmp_path):
    audit = tmp_path / "audit.jsonl"
    limited = actions_config(limits={"requests_per_minute": 60, "burst": 5})
    with actions_receiver(limited, TOKEN, audit) as (url, _):
        started = time.monotonic()
        statuses = [post(url, payload(), token="wrong-token-000000")[0] for _ in range(100)]
        statuses += [post(url, {}, path="/nowhere")[0] for _ in range(50)]
        # the burst of 5, then one request a second as the bucket refills (60 a minute)
        allowed = 5 + int(time.monotonic() - started)
    assert 5 <= statuses.count(401) <= allowed, statuses
    assert statuses.count(401) + statuses.count(429) == 150
    lines = audit.read_text().splitlines()
    assert len(lines) <= allowed + 1, f"{len(lines)} audit lines for 150 refused requests"


def test_the_allow_list_matches_whole_job_names():
    from trainprof.actions import decide
    from trainprof.actions.payload import parse

    config = actions_config(local={"jobs": {"starved": {"pid_file": "/x.pid"}}})
    plans = [
        decide.plan(config, alert)
        for alert in parse(
            payload({"training_job": "starved-evil"}, {"training_job": "xstarved"}, {})
        )
    ]
    assert [p.decision for p in plans] == ["ignored", "ignored", "stop"]
    assert "starved-evil is not allow-listed" in plans[0].reason


def test_the_audit_log_is_a_file_by_default_so_a_restart_remembers():
    config = actions_config()
    assert config.audit_log not in ("-", "")
    assert config.audit_log.endswith(".jsonl")


# --- basic auth ----------------------------------------------------------------------------------


def fake_hash(password: str) -> str:
    return "$2y$10$" + password.ljust(53, ".")


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_an_unknown_user_costs_the_same_bcrypt_work_as_a_known_one():
    checks = []

    def check(password: bytes, hashed: bytes) -> bool:
        checks.append(hashed)
        return hashed == fake_hash(password.decode()).encode()

    web = webconfig.parse({"basic_auth_users": {"prom": fake_hash("s3cret")}}, check_password=check)
    assert web.authorized("nobody", "s3cret", client="a") is False
    assert checks == [fake_hash("s3cret").encode()], "an unknown user ran no bcrypt check"
    assert web.authorized("prom", "guess", client="a") is False
    assert len(checks) == 2


def test_password_guessing_is_limited_per_client_and_bcrypt_runs_one_at_a_time():
    running_now, most = [0], [0]
    lock = threading.Lock()

    def check(password: bytes, hashed: bytes) -> bool:
        with lock:
            running_now[0] += 1
            most[0] = max(most[0], running_now[0])
        time.sleep(0.02)
        with lock:
            running_now[0] -= 1
        return hashed == fake_hash(password.decode()).encode()

    web = webconfig.parse({"basic_auth_users": {"prom": fake_hash("s3cret")}}, check_password=check)
    exporter = start(web=web)
    try:
        statuses = []

        def guess(i):
            statuses.append(get(exporter.port, headers=basic("prom", f"guess{i}"))[0])

        threads = [threading.Thread(target=guess, args=(i,)) for i in range(30)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert most[0] == 1, f"{most[0]} bcrypt checks ran at once"
        assert statuses.count(401) == webconfig.FAILURE_BURST
        assert statuses.count(429) == 30 - webconfig.FAILURE_BURST
    finally:
        exporter.stop()


def test_a_malformed_bcrypt_hash_is_refused_at_start_up():
    for bad in ("$2y$10$short", "$2y$99$" + "a" * 53, "$2y$10$" + "!" * 53):
        with pytest.raises(webconfig.WebConfigError, match="malformed bcrypt hash"):
            webconfig.parse({"basic_auth_users": {"prom": bad}}, check_password=lambda *_: True)


@pytest.fixture
def encrypted_key(tmp_path, openssl):
    key, cert = tmp_path / "enc.key", tmp_path / "server.crt"
    subprocess.run(
        [openssl, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
        + ["-aes-128-cbc", "-pass", "pass:hunter2", "-out", str(key)],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [openssl, "req", "-x509", "-new", "-key", str(key), "-passin", "pass:hunter2"]
        + ["-subj", "/CN=127.0.0.1", "-days", "1", "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_an_encrypted_tls_key_is_refused_with_a_clear_error_not_a_prompt(encrypted_key, tmp_path):
    cert, key = encrypted_key
    web = tmp_path / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
    actions = tmp_path / "actions.yaml"
    actions.write_text(json.dumps({**BASE, "tls": {"cert_file": str(cert), "key_file": str(key)}}))
    for args in (
        ["exporter", "--web.listen-address", "127.0.0.1:0", "--web.config.file", str(web)],
        ["actions", "serve", "-c", str(actions)],
    ):
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from trainprof.cli import main; sys.exit(main(sys.argv[1:]))",
                *args,
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            start_new_session=True,  # no terminal to prompt on
            env={"UNUSED_IN_TESTS": TOKEN, "PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 2, done.stderr
        assert "is encrypted (it has a passphrase)" in done.stderr
        assert "Traceback" not in done.stderr

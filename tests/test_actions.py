"""The StopTraining receiver over real HTTP on loopback, fed Alertmanager's own payloads.

The payloads start from `fixtures/webhook-v4-starved.json`, captured from Alertmanager 0.25
in the end-to-end test. Where a test needs to know that nothing was stopped, the stopper is a
spy that records every call; one test stops a real child process.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from trainprof.actions import local
from trainprof.actions.audit import history
from trainprof.actions.config import load_actions_config

from servers import actions_receiver
from webhook import FIXTURE, TOKEN, payload, post

BASE = {
    "token_env": "UNUSED_IN_TESTS",
    "allow": {"namespaces": ["team-a"], "training_jobs": ["starved", "bert-.*"]},
    "rules": {"CPUBottleneck": "stop", "LowGPUUtilization": "notify"},
    "local": {"jobs": {"starved": {"pid_file": "/nonexistent/starved.pid"}}},
}


def config(**changes):
    return load_actions_config({**BASE, **changes})


class Spy:
    """A stopper that records what it was asked to stop."""

    def __init__(self, result: str = "stopped"):
        self.calls, self.result = [], result

    def __call__(self, plan):
        self.calls.append((plan.namespace, plan.name))
        return local.Outcome(self.result, f"spy: {self.result}")


def decisions(audit_path: Path) -> list[dict]:
    return [r for r in history(str(audit_path)) if r["event"] == "decision"]


@pytest.fixture
def audit_path(tmp_path):
    return tmp_path / "audit.jsonl"


# --- acting --------------------------------------------------------------------------------


def test_an_authorised_firing_alert_stops_a_real_child_process(tmp_path, audit_path):
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True
    )
    try:
        pid_file = tmp_path / "starved.pid"
        pid_file.write_text(f"{child.pid}\n")
        live = config(
            dry_run=False,
            local={"jobs": {"starved": {"pid_file": str(pid_file), "process_group": True}}},
        )
        with actions_receiver(live, TOKEN, audit_path) as (url, _):
            status, _, body = post(url, payload())
        assert status == 200
        assert body["decisions"][0]["decision"] == "stopped"
        assert child.wait(timeout=10) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    [record] = decisions(audit_path)
    assert record["decision"] == "stopped"
    assert record["reason"].startswith(f"sent SIGTERM to process group {child.pid}")
    assert (record["training_job"], record["rule"]) == ("starved", "CPUBottleneck")


def test_dry_run_is_the_default_and_stops_nothing(audit_path):
    spy = Spy()
    with actions_receiver(config(), TOKEN, audit_path, stop=spy) as (url, _):
        status, _, body = post(url, payload())
    assert (status, body["decisions"][0]["decision"]) == (200, "would_stop")
    assert spy.calls == []
    assert decisions(audit_path)[0]["dry_run"] is True


def test_notify_only_rules_are_audited_and_stop_nothing(audit_path):
    spy = Spy()
    alert = {"rule": "LowGPUUtilization", "alertname": "TrainingLowGPUUtilization"}
    with actions_receiver(config(dry_run=False), TOKEN, audit_path, stop=spy) as (url, _):
        status, _, body = post(url, payload(alert))
    assert (status, body["decisions"][0]["decision"]) == (200, "notified")
    assert spy.calls == []


@pytest.mark.parametrize(
    "changes, status, why",
    [
        ({}, "resolved", "resolved alerts are never acted on"),
        ({"rule": "StepOutlier"}, "firing", "rule 'StepOutlier' is not opted in"),
        ({"rule": None}, "firing", "rule '' is not opted in"),
        ({"training_job": None}, "firing", "the alert has no training_job label"),
        ({"namespace": None}, "firing", "the alert has no namespace label"),
        ({"namespace": "team-b"}, "firing", "namespace team-b is not allow-listed"),
        ({"training_job": "gpt-neo"}, "firing", "training job gpt-neo is not allow-listed"),
        ({"training_job": "bert-base"}, "firing", "no local job bert-base is configured"),
    ],
    ids=[
        "resolved",
        "not opted in",
        "no rule label",
        "no training_job",
        "no namespace",
        "other namespace",
        "other job",
        "no local target",
    ],
)
def test_alerts_it_must_not_act_on_are_ignored(changes, status, why, audit_path):
    spy = Spy()
    with actions_receiver(config(dry_run=False), TOKEN, audit_path, stop=spy) as (url, _):
        code, _, body = post(url, payload(changes, status=status))
    assert code == 200
    assert (body["decisions"][0]["decision"], body["decisions"][0]["reason"]) == ("ignored", why)
    assert spy.calls == []


def test_two_alerts_for_one_job_stop_it_once(audit_path):
    spy = Spy()
    live = config(dry_run=False, rules={"CPUBottleneck": "stop", "IOBottleneck": "stop"})
    data = json.loads(FIXTURE.read_text())  # CPU- and IOBottleneck, one job
    with actions_receiver(live, TOKEN, audit_path, stop=spy) as (url, _):
        status, _, body = post(url, data)
    assert status == 200
    assert [d["decision"] for d in body["decisions"]] == ["stopped", "duplicate"]
    assert spy.calls == [("team-a", "starved")]


# --- refusing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "token",
    [None, "", "wrong-token-0123456789abcdef", TOKEN[:-1], TOKEN + "x", "Basic " + TOKEN],
    ids=["none", "empty", "wrong", "prefix", "longer", "basic"],
)
def test_requests_without_the_token_are_refused_with_401(token, audit_path):
    spy = Spy()
    headers = {}
    if token is not None and token.startswith("Basic "):
        headers, token = {"Authorization": token}, None
    with actions_receiver(config(dry_run=False), TOKEN, audit_path, stop=spy) as (url, _):
        status, response_headers, body = post(url, payload(), token=token, headers=headers)
    assert status == 401
    assert response_headers["WWW-Authenticate"].startswith("Bearer")
    assert "decisions" not in body
    assert spy.calls == [] and decisions(audit_path) == []
    assert TOKEN not in audit_path.read_text()


@pytest.mark.parametrize(
    "body, content_type, status",
    [
        (b"{not json", "application/json", 400),
        (b"\xff\xfe{}", "application/json", 400),
        (b"[" * 100_000 + b"]" * 100_000, "application/json", 400),
        (b"[]", "application/json", 422),
        (json.dumps({"version": "3", "alerts": []}).encode(), "application/json", 422),
        (json.dumps({**payload(), "alerts": "CPUBottleneck"}).encode(), "application/json", 422),
        (json.dumps(payload()).replace('"starved"', "7", 1).encode(), "application/json", 422),
        (json.dumps(payload()).replace('"firing"', '"exploded"').encode(), "application/json", 422),
        (json.dumps(payload()).encode(), "text/plain", 415),
    ],
    ids=[
        "not json",
        "not utf-8",
        "nested too deep",
        "a list",
        "version 3",
        "alerts not a list",
        "label not a string",
        "unknown status",
        "wrong content type",
    ],
)
def test_malformed_requests_are_refused(body, content_type, status, audit_path):
    spy = Spy()
    with actions_receiver(
        config(dry_run=False, limits={"max_body_bytes": 1 << 20}), TOKEN, audit_path, stop=spy
    ) as (url, _):
        code, _, response = post(url, body, content_type=content_type)
    assert code == status, response
    assert spy.calls == []
    [request] = [r for r in history(str(audit_path)) if r["event"] == "request"]
    assert request["status"] == status


def test_oversized_requests_are_refused_before_the_body_is_read(audit_path):
    spy = Spy()
    small = config(dry_run=False, limits={"max_body_bytes": 2048})
    with actions_receiver(small, TOKEN, audit_path, stop=spy) as (url, _):
        big = payload(*({"node": f"n{i}"} for i in range(20)))
        assert len(json.dumps(big)) > 2048
        assert post(url, big)[0] == 413
        # A client that announces a huge body and sends none gets its answer at once.
        # Clients that announce a huge body, or a chunked one, get their answer before
        # sending any of it.
        for header, value, status in (
            ("Content-Length", str(10**12), 413),
            ("Transfer-Encoding", "chunked", 411),
        ):
            host, port = url.removeprefix("http://").split(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            conn.putrequest("POST", "/alerts")
            conn.putheader("Authorization", f"Bearer {TOKEN}")
            conn.putheader("Content-Type", "application/json")
            conn.putheader(header, value)
            conn.endheaders()
            assert conn.getresponse().status == status
            conn.close()
    assert spy.calls == []


def test_a_body_that_never_arrives_times_out_with_408(audit_path, monkeypatch, capfd):
    import socket

    from trainprof.actions import server

    monkeypatch.setattr(server, "TIMEOUT", 0.5)
    with actions_receiver(config(), TOKEN, audit_path) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as client:
            client.sendall(
                f"POST /alerts HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n"
                "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode()
            )
            assert client.recv(100).startswith(b"HTTP/1.1 408 ")
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize(
    "changes",
    [
        {"training_job": "starved; kill -9 1"},
        {"training_job": "../../../etc/passwd"},
        {"training_job": 'starved\n{"decision": "stopped"}'},
        {"training_job": "$(reboot)"},
        {"namespace": "team-a/../kube-system"},
        {"namespace": "team-a\r\nX-Injected: 1"},
    ],
    ids=["shell", "path", "newline", "substitution", "namespace path", "header"],
)
def test_label_injection_is_refused_alone_and_logged_escaped(changes, audit_path):
    spy = Spy()
    with actions_receiver(config(dry_run=False), TOKEN, audit_path, stop=spy) as (url, _):
        # The hostile alert rides along with a valid one: only the hostile one is refused,
        # the legitimate stop beside it goes ahead.
        status, _, body = post(url, payload({}, changes))
        alone = post(url, payload(changes))
    assert status == 200
    assert [d["decision"] for d in body["decisions"]] == ["stopped", "refused"]
    assert spy.calls == [("team-a", "starved")]
    assert alone[0] == 422, "a delivery with nothing but hostile alerts is refused whole"
    records = decisions(audit_path)
    assert [r["decision"] for r in records] == ["stopped", "refused", "refused"]
    assert all(line.startswith("{") for line in audit_path.read_text().splitlines())
    [value] = changes.values()
    assert repr(value) in records[1]["reason"]


def test_a_replayed_delivery_is_answered_but_not_acted_on_again(audit_path, tmp_path):
    spy = Spy()
    live = config(dry_run=False)
    with actions_receiver(live, TOKEN, audit_path, stop=spy) as (url, _):
        first = post(url, payload())
        again = post(url, payload())
    # ...and not after a restart either: the audit log remembers what was stopped.
    with actions_receiver(live, TOKEN, audit_path, stop=spy) as (url, _):
        after_restart = post(url, payload())
    assert first[2]["decisions"][0]["decision"] == "stopped"
    assert again[0] == after_restart[0] == 200
    assert again[2]["decisions"][0]["decision"] == "duplicate"
    assert after_restart[2]["decisions"][0]["decision"] == "duplicate"
    assert spy.calls == [("team-a", "starved")]


def test_a_new_firing_after_the_cooldown_stops_again(audit_path):
    spy = Spy()
    live = config(dry_run=False, cooldown="0s")
    refired = payload()
    refired["alerts"][0]["startsAt"] = "2026-11-22T03:00:00Z"
    with actions_receiver(live, TOKEN, audit_path, stop=spy) as (url, _):
        post(url, payload())
        post(url, refired)
    assert spy.calls == [("team-a", "starved")] * 2


def test_a_failed_stop_answers_502_so_alertmanager_retries(audit_path):
    spy = Spy("failed")
    with actions_receiver(config(dry_run=False), TOKEN, audit_path, stop=spy) as (url, _):
        assert post(url, payload())[0] == 502
        assert post(url, payload())[0] == 502
    assert len(spy.calls) == 2


def test_requests_over_the_rate_limit_get_429(audit_path):
    spy = Spy()
    limited = config(dry_run=False, limits={"requests_per_minute": 1, "burst": 2})
    with actions_receiver(limited, TOKEN, audit_path, stop=spy) as (url, _):
        assert post(url, payload(), token="wrong-token-0123456789abcdef")[0] == 401
        assert post(url, payload())[0] == 200
        status, headers, _ = post(url, payload())
    assert status == 429
    assert int(headers["Retry-After"]) >= 1
    assert len(spy.calls) == 1


def test_a_connection_over_the_cap_takes_the_slot_of_one_that_sends_nothing(
    audit_path, monkeypatch
):
    import socket

    from trainprof.actions import server

    monkeypatch.setattr(server, "MAX_CONNECTIONS", 3)
    with actions_receiver(config(), TOKEN, audit_path) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(3)]
        try:
            with urllib.request.urlopen(url + "/-/healthy", timeout=10) as r:
                assert r.status == 200
            assert idle[0].recv(10) == b"", "the longest idle connection made room"
        finally:
            for s in idle:
                s.close()


def test_other_paths_and_methods_are_refused(audit_path):
    with actions_receiver(config(), TOKEN, audit_path) as (url, _):
        assert post(url, payload(), path="/alert")[0] == 404
        request = urllib.request.Request(url + "/alerts", method="PUT", data=b"{}")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 405
        refused.value.close()
        with urllib.request.urlopen(url + "/-/healthy", timeout=10) as r:
            assert r.status == 200


def test_the_receiver_serves_https_with_a_configured_certificate(tmp_path, audit_path):
    import ssl

    from trainprof.actions.server import ActionsHTTPServer, tls_context

    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    with actions_receiver(config(), TOKEN, audit_path) as (_, receiver):
        server = ActionsHTTPServer(("127.0.0.1", 0), receiver, tls_context(str(cert), str(key)))
        import threading

        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"https://127.0.0.1:{server.server_address[1]}"
            context = ssl.create_default_context(cafile=str(cert))
            request = urllib.request.Request(
                url + "/alerts",
                data=json.dumps(payload()).encode(),
                method="POST",
                headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10, context=context) as r:
                assert json.loads(r.read())["decisions"][0]["decision"] == "would_stop"
        finally:
            server.shutdown()
            server.server_close()


# --- local processes -------------------------------------------------------------------------


def test_pid_files_that_do_not_name_a_process_are_not_signalled(tmp_path):
    pid_file = tmp_path / "job.pid"
    for content, expected in [
        ("1", "not a training process"),
        ("abc", "does not hold"),
        ("12 34", "does not hold"),
        ("9" * 70, "does not hold"),
    ]:
        pid_file.write_text(content)
        outcome = local.stop(local.LocalJob(str(pid_file)))
        assert outcome.result == "failed" and expected in outcome.detail, content
    link = tmp_path / "link.pid"
    pid_file.write_text(str(os.getpid()))
    link.symlink_to(pid_file)
    assert local.stop(local.LocalJob(str(link))).result == "failed"
    assert local.stop(local.LocalJob(str(tmp_path / "none.pid"))).result == "gone"
    pid_file.write_text(str(os.getpid()))
    assert local.stop(local.LocalJob(str(pid_file))).result == "failed"  # ourselves
    assert local.stop(local.LocalJob(str(pid_file), process_group=True)).result == "failed"


def test_a_process_that_already_exited_is_gone(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    pid_file = tmp_path / "job.pid"
    pid_file.write_text(str(child.pid))
    assert local.stop(local.LocalJob(str(pid_file))).result == "gone"

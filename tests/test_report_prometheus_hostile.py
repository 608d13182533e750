"""`trainprof report --prometheus` against a server that misbehaves: a real Prometheus (the
live job) behind a small hostile front that redirects to another host, echoes the
credentials, mangles an answer, trickles or floods. Each ends in one sentence naming the
server (and the query) with exit 2, or 1 when the server cannot be read; never a traceback,
a hang, unbounded memory or a credential sent elsewhere or printed."""

from __future__ import annotations

import base64
import json
import math
import threading
import time

import pytest
import yaml

from trainprof.cli import main
from trainprof.engines.prometheus_api import PrometheusAPI, PrometheusAPIError

from hostile_front import answer, flooding, forward, forwarding, front, redirecting, trickling

TOKEN = "s3cret-token-value"
PASSWORD = "pa55word-value"
BASIC = "Basic " + base64.b64encode(f"reporter:{PASSWORD}".encode()).decode()


@pytest.fixture
def access(tmp_path, request):
    """The report's access options for a bearer token or basic auth, and what must never
    leak of them."""
    token, password = tmp_path / "token", tmp_path / "password"
    token.write_text(TOKEN + "\n")
    password.write_text(PASSWORD)
    if getattr(request, "param", "bearer") == "bearer":
        return ["--bearer-token-file", str(token)], [TOKEN]
    return (
        ["--basic-auth-user", "reporter", "--basic-auth-password-file", str(password)],
        [PASSWORD, BASIC.split()[1]],
    )


def report(capsys, tmp_path, url: str, job: str, *extra: str) -> tuple[int, str]:
    from conftest import LIVE_RULES

    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(LIVE_RULES))
    capsys.readouterr()
    code = main(
        ["report", "--prometheus", url, "--job", job, "--rules", str(rules)]
        + ["-o", str(tmp_path / "r.html"), *extra]
    )
    return code, capsys.readouterr().err


both = pytest.mark.parametrize("access", ["bearer", "basic"], indirect=True)


@both
def test_a_redirect_to_another_host_sends_it_no_credentials(live_job, access, capsys, tmp_path):
    base, live, _ = live_job
    options, secrets = access
    with front(forwarding(base)) as (elsewhere, reached):
        other_host = elsewhere.replace("127.0.0.1", "localhost")
        with front(redirecting(other_host)) as (url, _):
            code, err = report(capsys, tmp_path, url, live.training_job, *options)
    assert reached == [], "the credentials went to the other host"
    assert code == 2, err
    assert f"Prometheus at {url} redirected (HTTP 302) to another server, http://localhost:" in err
    assert not any(s in err for s in secrets) and "Traceback" not in err


def test_a_redirect_within_the_server_is_followed_with_the_credentials(
    live_job, access, capsys, tmp_path
):
    base, live, _ = live_job
    options, _ = access

    def respond(request):
        if not request.path.startswith("/prometheus/"):
            answer(request, 301, b"", Location="/prometheus" + request.path)
        elif request.headers.get("Authorization") != f"Bearer {TOKEN}":
            answer(request, 401, b"")
        else:
            request.path = request.path.removeprefix("/prometheus")
            status, body = forward(base, request)
            answer(request, status, body, Content_Type="application/json")

    with front(respond) as (url, seen):
        code, err = report(capsys, tmp_path, url, live.training_job, *options)
    assert code == 0, err
    assert seen[0][0].startswith("/api/v1/") and seen[1][0].startswith("/prometheus/api/v1/")


@both
@pytest.mark.parametrize("status", [400, 200])
def test_a_server_echoing_the_credentials_never_gets_them_printed(
    live_job, access, status, capsys, tmp_path
):
    _, live, _ = live_job
    options, secrets = access

    def echo(request):
        said = f"bad header {request.headers.get('Authorization')} for {request.path}"
        body = {"status": "error", "errorType": "bad_data", "error": said}
        answer(request, status, json.dumps(body).encode(), Content_Type="application/json")

    with front(echo) as (url, seen):
        code, err = report(capsys, tmp_path, url, live.training_job, *options)
    assert any(s in str(seen) for s in secrets), "the front did not get the credentials"
    assert code == 1 and "bad header *** for /api/v1/query" in err, err
    assert not any(s in err for s in secrets)


@both
def test_credentials_echoed_in_the_data_never_reach_a_message(live_job, access, capsys, tmp_path):
    """The front names its jobs after the Authorization header it got; the report lists
    the jobs Prometheus knows when the one asked for is not there."""
    base, _, _ = live_job
    options, secrets = access

    def respond(request):
        if request.path.startswith("/api/v1/label/"):
            echoed = [f"job-of-{request.headers.get('Authorization')}"]
            body = json.dumps({"status": "success", "data": echoed}).encode()
            answer(request, 200, body, Content_Type="application/json")
        else:
            forwarding(base)(request)

    with front(respond) as (url, _):
        code, err = report(capsys, tmp_path, url, "no-such-job", *options)
    assert code == 2 and "jobs Prometheus knows: job-of-" in err, err
    assert not any(s in err for s in secrets)


def _first(kind: str, change):
    """A change to the first answer of `kind` (query, query_range, label) that has a
    result, made once."""
    done = []

    def changed(path, doc):
        if done or not path.startswith(f"/api/v1/{kind}"):
            return None
        if kind != "label" and not doc["data"]["result"]:
            return None
        done.append(path)
        return change(doc)

    return changed


def _set(doc, where, value):
    doc["data"]["result"][0][where][0] = value
    return doc


MALFORMED = {
    "a list": ("query", lambda doc: [], "the answer is a list, not an object"),
    "data null": ("query", lambda doc: {"status": "success", "data": None}, "data is null"),
    "no resultType": (
        "query",
        lambda doc: {"status": "success", "data": {"result": doc["data"]["result"]}},
        "data has no resultType",
    ),
    "a matrix for an instant query": (
        "query",
        lambda doc: {"status": "success", "data": {"resultType": "matrix", "result": []}},
        "resultType 'matrix' where vector or scalar was expected",
    ),
    "a value that is not a number": (
        "query_range",
        lambda doc: _set(doc, "values", [doc["data"]["result"][0]["values"][0][0], "abc"]),
        "a sample's value is 'abc', not a number",
    ),
    "a NaN time": (
        "query_range",
        lambda doc: _set(doc, "values", [math.nan, "1"]),
        "a sample's time is nan, not a finite number",
    ),
    "an instant NaN time": (
        "query",
        lambda doc: {
            "status": "success",
            "data": {"resultType": "vector", "result": [{"metric": {}, "value": [math.nan, "1"]}]},
        },
        "a sample's time is nan, not a finite number",
    ),
    "labels that are not strings": (
        "query_range",
        lambda doc: {**doc, "data": {**doc["data"], "result": [{"metric": [], "values": []}]}},
        "a series' labels are [], not names and strings",
    ),
    "label values that are not a list": (
        "label",
        lambda doc: {"status": "success", "data": {"resultType": "vector"}},
        "expected a list, got an object",
    ),
    "not JSON": ("query", lambda doc: b"<html>", "not JSON"),
}


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_a_malformed_answer_is_a_sentence_naming_the_server_and_the_query(
    live_job, case, capsys, tmp_path
):
    base, live, _ = live_job
    kind, change, problem = MALFORMED[case]
    job = "no-such-job" if kind == "label" else live.training_job
    with front(forwarding(base, _first(kind, change))) as (url, seen):
        code, err = report(capsys, tmp_path, url, job)
    assert code == 2, err
    assert f"{url} did not answer like Prometheus" in err and problem in err, err
    asked = seen[-1][0]
    if kind == "label":
        assert "/api/v1/label/training_job/values" in err
    else:
        assert "for the query\n" in err and ("timestamp(" in err or kind == "query_range")
        assert asked.startswith(f"/api/v1/{kind}")


def _within(seconds: float, call):
    """`call()`'s exception (or None) if it returns within `seconds`; fails otherwise."""
    outcome: list = []

    def run():
        try:
            call()
            outcome.append(None)
        except Exception as e:  # noqa: BLE001 - the test looks at it
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"still waiting after {seconds:g}s"
    return outcome[0]


@pytest.mark.parametrize(
    "trickle",
    [
        trickling(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", every=0.3),
        trickling(b"HTTP/1.1 200 OK\r\nX-Slow: ", every=0.3, body=False),
    ],
    ids=["a byte of body at a time", "a byte of headers at a time"],
)
def test_a_trickling_server_is_cut_off_at_the_deadline(trickle):
    with front(trickle) as (url, _):
        started = time.monotonic()
        error = _within(10, lambda: PrometheusAPI(url, timeout=1.5).instant("up", at=1.0))
    assert isinstance(error, PrometheusAPIError) and not error.bad_input
    assert f"Prometheus at {url} gave no complete answer within 1.5s for the query\nup" == str(
        error
    )
    assert time.monotonic() - started < 4


def test_the_report_takes_its_deadline_from_prometheus_timeout(capsys, tmp_path):
    trickle = trickling(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", every=0.3)
    with front(trickle) as (url, _):
        started = time.monotonic()
        code, err = report(capsys, tmp_path, url, "j", "--prometheus-timeout", "1s")
    assert code == 1 and "gave no complete answer within 1s" in err, err
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("declare", [False, True], ids=["chunked", "Content-Length 1 GiB"])
def test_a_flood_is_cut_off_at_the_cap(declare, capsys, tmp_path):
    sent = [0]
    with front(flooding(sent, declare=declare)) as (url, _):
        code, err = report(capsys, tmp_path, url, "j")
        time.sleep(0.2)  # the front notices the closed connection
    assert code == 2 and f"Prometheus at {url}: the answer is larger than 32 MiB" in err, err
    assert sent[0] < 2**30 // 4, f"the report read {sent[0] / 2**20:.0f} MiB"


def test_credentials_in_the_url_are_refused_without_showing_them(capsys, tmp_path):
    code, err = report(capsys, tmp_path, f"http://reporter:{PASSWORD}@127.0.0.1:9", "j")
    assert code == 2 and "--prometheus http://127.0.0.1:9: a user or password in the URL" in err
    assert PASSWORD not in err

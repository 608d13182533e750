"""`trainprof report --prometheus` against a real Prometheus: verdicts from the rules' own
expressions, each rule's status, and access through an authenticating front (bearer token,
basic auth, a tenant header) as Mimir, Cortex or a reverse proxy put before Prometheus."""

from __future__ import annotations

import base64
import contextlib
import subprocess
import sys
import urllib.request
from http.server import BaseHTTPRequestHandler

import yaml

from trainprof.contract.durations import parse_duration
from trainprof.report import from_prometheus
from trainprof.rules.compiler import compile_rules

from servers import _loopback, get_json, wait_for_firing

TOKEN = "s3cret-token-value"
PASSWORD = "pa55word-value"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", *args], capture_output=True, text=True, timeout=300
    )


@contextlib.contextmanager
def authenticating_front(upstream: str, tenant: str = "team-a"):
    """Forwards GETs to `upstream` only with the bearer token or the basic-auth pair, and
    the tenant's X-Scope-OrgID; 401 otherwise."""
    basic = "Basic " + base64.b64encode(f"reporter:{PASSWORD}".encode()).decode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            auth = self.headers.get("Authorization")
            if (
                auth not in (f"Bearer {TOKEN}", basic)
                or self.headers.get("X-Scope-OrgID") != tenant
            ):
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with urllib.request.urlopen(upstream + self.path, timeout=60) as r:
                body = r.read()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with _loopback(Handler) as base:
        yield base


def _rules_file(tmp_path):
    from conftest import LIVE_RULES

    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(LIVE_RULES))
    return rules


def test_the_report_authenticates_with_a_bearer_token_and_a_tenant_header(live_job, tmp_path):
    base, live, _ = live_job
    wait_for_firing(base, {"LowGPUUtilization"})
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    rules = _rules_file(tmp_path)
    with authenticating_front(base) as front:
        common = ["report", "--prometheus", front, "--job", live.training_job, "--rules"]
        refused = cli(*common, str(rules), "-o", str(tmp_path / "r.html"))
        assert refused.returncode == 1 and "refused the credentials (HTTP 401)" in refused.stderr
        assert "Traceback" not in refused.stderr
        written = cli(
            *common,
            str(rules),
            "--bearer-token-file",
            str(token),
            "--header",
            "X-Scope-OrgID: team-a",
            "-o",
            str(tmp_path / "r.html"),
        )
        assert written.returncode == 0, written.stderr
        assert TOKEN not in written.stderr + written.stdout
        password = tmp_path / "password"
        password.write_text(PASSWORD)
        basic = cli(
            *common,
            str(rules),
            "--basic-auth-user",
            "reporter",
            "--basic-auth-password-file",
            str(password),
            "--header",
            "X-Scope-OrgID: team-a",
            "-o",
            str(tmp_path / "b.html"),
        )
        assert basic.returncode == 0, basic.stderr
        wrong_tenant = cli(
            *common,
            str(rules),
            "--bearer-token-file",
            str(token),
            "--header",
            "X-Scope-OrgID: team-b",
            "-o",
            str(tmp_path / "w.html"),
        )
        assert wrong_tenant.returncode == 1 and TOKEN not in wrong_tenant.stderr


def test_bad_access_options_are_one_sentence_and_exit_2(tmp_path):
    missing = cli(
        "report",
        "--prometheus",
        "http://127.0.0.1:9",
        "--job",
        "x",
        "--bearer-token-file",
        str(tmp_path / "nope"),
        "-o",
        str(tmp_path / "r.html"),
    )
    assert missing.returncode == 2 and "--bearer-token-file" in missing.stderr
    assert "Traceback" not in missing.stderr
    header = cli(
        "report",
        "--prometheus",
        "http://127.0.0.1:9",
        "--job",
        "x",
        "--header",
        "no colon here",
        "-o",
        str(tmp_path / "r.html"),
    )
    assert header.returncode == 2 and "expected 'Name: value'" in header.stderr


def test_first_fired_times_come_from_the_rule_expressions(live_job):
    """Each alert's first firing, derived from its expression and `for:`, is when
    Prometheus' own rule manager made it fire (activeAt + for), to one evaluation."""
    base, live, config = live_job
    wait_for_firing(base, {"LowGPUUtilization", "CPUBottleneck", "BatchSize"})
    collected = from_prometheus(base, live.training_job, config)
    holds, intervals = {}, {}
    for group in compile_rules(config).groups:
        for rule in group["rules"]:
            if "alert" in rule:
                holds[rule["alert"]] = parse_duration(rule.get("for", "0s"))
                intervals[rule["alert"]] = parse_duration(group["interval"])
    active = {}
    for group in get_json(f"{base}/api/v1/rules?type=alert")["data"]["groups"]:
        for rule in group["rules"]:
            for alert in rule["alerts"]:
                if alert["state"] == "firing":
                    import datetime

                    at = datetime.datetime.fromisoformat(alert["activeAt"].replace("Z", "+00:00"))
                    key = (rule["name"], alert["labels"].get("gpu"), alert["labels"].get("node"))
                    active[key] = at.timestamp() + holds[rule["name"]]
    checked = 0
    for name in ("LowGPUUtilization", "CPUBottleneck", "BatchSize"):
        verdict = collected.verdicts[name]
        assert verdict.fired and verdict.status.status == "fired"
        for alert in verdict.alerts:
            key = (alert.labels["alertname"], alert.labels.get("gpu"), alert.labels.get("node"))
            if key in active:
                assert abs(alert.fired_at - active[key]) <= intervals[key[0]] + 0.5, (key, alert)
                checked += 1
    assert checked
    assert collected.verdicts["StepOutlier"].status.status in ("fired", "quiet")
    # one alert for the job; the GPUs it found read back from its affected recording
    low = collected.verdicts["LowGPUUtilization"]
    assert {a.labels.get("gpu") for a in low.alerts} == {None}
    assert low.affected and all("gpu" in u.labels for u in low.affected)


def test_disk_and_network_totals_from_prometheus(live_job):
    from trainprof.report import build

    base, live, config = live_job
    wait_for_firing(base, {"LowGPUUtilization"})
    built = build(from_prometheus(base, live.training_job, config))
    tables = [t for s in built.sections for t in s.tables]
    totals = next(t for t in tables if t.caption == "Disk and network totals")
    assert totals.columns == [
        "Node",
        "Disk read",
        "Disk written",
        "Network received",
        "Network sent",
    ]
    assert totals.rows and all(
        cell.endswith("B") and cell[0].isdigit() for row in totals.rows for cell in row[1:]
    ), totals.rows
    usage = next(t for t in tables if t.caption.startswith("Overall system usage"))
    assert any(row[1].startswith("GPU 0 ") for row in usage.rows)

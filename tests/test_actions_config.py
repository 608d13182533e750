"""The receiver's configuration and command line: every problem at once, exit 2, no traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest
import yaml

from trainprof.actions.config import load_actions_config, read_actions_config, read_token
from trainprof.cli import main
from trainprof.rules.catalog import CATALOG
from trainprof.rules.config import ConfigError

from servers import free_port, wait_for
from webhook import TOKEN, payload, post

GOOD = {"token_env": "TRAINPROF_TEST_TOKEN", "rules": {"CPUBottleneck": "notify"}}


# The valid names the message lists: every alerting rule of the catalog, which grows.
ALERTING_RULES = ", ".join(r.name for r in CATALOG if r.alerting)


def problems(data) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_actions_config(data, "actions.yaml")
    return [str(p) for p in e.value.problems]


def test_the_example_configuration_is_valid_and_a_dry_run(root):
    config = read_actions_config(str(root / "alerting" / "actions" / "actions.example.yaml"))
    assert config.dry_run is True
    assert config.kubernetes.resource == "Job"
    assert config.rules["CPUBottleneck"] == "stop"


def test_defaults_are_the_safe_ones():
    config = load_actions_config(GOOD)
    assert config.dry_run is True
    assert config.listen == ("127.0.0.1", 9095)
    assert config.target == "none"


def test_every_problem_is_reported_at_once_with_its_path_and_nearest_name():
    found = problems(
        {
            "dryrun": False,
            "token_file": "/t",
            "token_env": "T",
            "listen": "0.0.0.0",
            "limits": {"max_body_bytes": 0, "requests_per_min": 5},
            "allow": {"namespace": ["team-a"], "training_jobs": ["bert-(", 3]},
            "rules": {"CPUBottlenek": "stop", "LowGPUUtilization": "kill", "StepOutlier": "Stop"},
            "kubernetes": {
                "resource": "Jobs",
                "action": "suspnd",
                "api_url": "http://kubernetes.default.svc",
            },
        }
    )
    assert found == [
        "dryrun: unknown key (did you mean dry_run?); valid keys: listen, tls, dry_run, "
        "token_file, token_env, audit_log, limits, cooldown, allow, rules, local, kubernetes",
        "listen: the string '0.0.0.0' is not host:port with an IP address or localhost "
        "(e.g. 127.0.0.1:9095, 0.0.0.0:9095, [::1]:9095)",
        "token_file: set exactly one of token_file and token_env: Alertmanager must present "
        "this bearer token (http_config.authorization)",
        "limits.requests_per_min: unknown key (did you mean requests_per_minute?); valid "
        "keys: max_body_bytes, requests_per_minute, burst",
        "limits.max_body_bytes: expected a whole number of 1 or more, got int 0",
        "rules.CPUBottlenek: not an alerting rule of the catalog (did you mean "
        f"CPUBottleneck?); rules: {ALERTING_RULES}",
        "rules.LowGPUUtilization: the string 'kill' is not one of stop, notify",
        "rules.StepOutlier: the string 'Stop' is not one of stop, notify (did you mean stop?)",
        "allow.namespace: unknown key (did you mean namespaces?); valid keys: namespaces, "
        "training_jobs",
        "allow.training_jobs: expected a list of strings, got a list",
        "kubernetes.resource: the string 'Jobs' is not one of Job, PyTorchJob, JobSet (did you "
        "mean Job?)",
        "kubernetes.action: the string 'suspnd' is not one of suspend, delete (did you mean "
        "suspend?)",
        "kubernetes.api_url: 'http://kubernetes.default.svc': use https:// (the token must "
        "not travel in clear), or http:// on loopback",
        "allow.namespaces: required with a kubernetes target: the namespaces whose jobs may "
        "be stopped",
        'allow.training_jobs: required with a kubernetes target; [".*"] allows every job of '
        "the allowed namespaces",
    ]


@pytest.mark.parametrize(
    "data, expected",
    [
        ({**GOOD, "rules": {}}, "rules: expected a mapping of rule name to stop or notify"),
        (
            {**GOOD, "rules": {"CPUBottleneck": "stop"}},
            "rules: CPUBottleneck set to stop, but no target is configured (local or kubernetes)",
        ),
        (
            {**GOOD, "local": {"jobs": {"a": {"pid_file": "run/a.pid"}}}},
            "local.jobs.a.pid_file: 'run/a.pid' is not an absolute path",
        ),
        (
            {**GOOD, "local": {"signal": "SIGHUP", "jobs": {"a": {"pid_file": "/a"}}}},
            "local.signal: the string 'SIGHUP' is not one of SIGTERM, SIGINT, SIGKILL",
        ),
        (
            {**GOOD, "local": {"jobs": {"a": {"pid_file": "/a"}}}, "kubernetes": {}},
            "kubernetes: configure one target: local or kubernetes, not both",
        ),
        (
            {**GOOD, "allow": {"namespaces": ["Team_A"]}},
            "allow.namespaces[0]: 'Team_A' is not a namespace name",
        ),
        ({**GOOD, "dry_run": "false"}, "dry_run: expected true or false, got the string 'false'"),
        ({**GOOD, "cooldown": "soon"}, "cooldown: 'soon' is not a duration"),
        ({**GOOD, "tls": {"cert_file": "/c"}}, "tls: set both cert_file and key_file (PEM)"),
        (
            {**GOOD, "local": {"signal": {"TERM": 1}, "jobs": {"a": {"pid_file": "/a"}}}},
            "local.signal: a mapping is not one of SIGTERM",
        ),
        (
            {
                **GOOD,
                "kubernetes": {"resource": ["Job"]},
                "allow": {"namespaces": ["a"], "training_jobs": [".*"]},
            },
            "kubernetes.resource: a list is not one of Job",
        ),
        ([], ": expected a mapping, got a list"),
    ],
)
def test_each_problem_names_its_path(data, expected):
    [found] = problems(data)
    assert found.startswith(expected.lstrip(": ")), found


def test_weak_or_missing_tokens_are_refused(tmp_path, monkeypatch):
    config = load_actions_config({**GOOD, "token_env": None, "token_file": str(tmp_path / "token")})
    with pytest.raises(ConfigError, match="cannot read"):
        read_token(config)
    (tmp_path / "token").write_text("short\n")
    with pytest.raises(ConfigError, match="at least 16 characters"):
        read_token(config)
    (tmp_path / "token").write_text(TOKEN + "\n")
    assert read_token(config) == TOKEN
    monkeypatch.delenv("TRAINPROF_TEST_TOKEN", raising=False)
    with pytest.raises(ConfigError, match="TRAINPROF_TEST_TOKEN is not set"):
        read_token(load_actions_config(GOOD))


# --- the command line ------------------------------------------------------------------------


def test_check_reports_every_problem_and_exits_2(tmp_path, capsys):
    path = tmp_path / "actions.yaml"
    path.write_text("dry_run: maybe\nrules: {CPUBottlenek: stop}\n")
    assert main(["actions", "check", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert "3 problems" in err and "did you mean CPUBottleneck?" in err
    assert "token_file: set exactly one of token_file and token_env" in err
    assert "Traceback" not in err
    path.write_text("rules: [\n")
    assert main(["actions", "serve", "-c", str(path)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    assert main(["actions", "serve", "-c", str(tmp_path / "missing.yaml")]) == 2


def test_check_accepts_a_good_configuration(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRAINPROF_TEST_TOKEN", TOKEN)
    path = tmp_path / "actions.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    assert main(["actions", "check", "-c", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "dry run: CPUBottleneck=notify; target none; namespaces (any); jobs (none)",
        "ok",
    ]


def test_rbac_prints_the_configurations_least_privilege(root, capsys):
    example = root / "alerting" / "actions" / "actions.example.yaml"
    assert (
        main(["actions", "rbac", "-c", str(example), "--service-account-namespace", "ml-ops"]) == 0
    )
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["ServiceAccount", "ClusterRole", "RoleBinding"]
    assert docs[0]["metadata"]["namespace"] == "ml-ops"


def test_serve_exits_1_when_the_port_is_taken(tmp_path, capsys, monkeypatch):
    import socket

    monkeypatch.setenv("TRAINPROF_TEST_TOKEN", TOKEN)
    path = tmp_path / "actions.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "audit_log": str(tmp_path / "audit.jsonl")}))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["actions", "serve", "-c", str(path), "--listen", f"127.0.0.1:{port}"]) == 1
    assert "cannot listen on 127.0.0.1" in capsys.readouterr().err
    assert main(["actions", "serve", "-c", str(path), "--listen", "nowhere"]) == 2


def test_serve_runs_until_sigterm_and_audits_what_it_did(tmp_path):
    port = free_port()
    audit = tmp_path / "audit.jsonl"
    path = tmp_path / "actions.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                **GOOD,
                "audit_log": str(audit),
                "listen": f"127.0.0.1:{port}",
                "allow": {"training_jobs": [".*"]},
            }
        )
    )
    env = {**os.environ, "TRAINPROF_TEST_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainprof.cli", "actions", "serve", "-c", str(path)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy():
            try:
                with urllib.request.urlopen(url + "/-/healthy", timeout=1) as r:
                    return r.status == 200
            except OSError:
                assert proc.poll() is None, proc.communicate()[1]
                return False

        wait_for(healthy, 30, "the receiver to answer")
        status, _, body = post(url, payload())
        assert (status, body["decisions"][0]["decision"]) == (200, "notified")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=10)
    assert proc.returncode == 0, stderr
    assert "listening on 127.0.0.1" in stderr and "Traceback" not in stderr
    events = [json.loads(line)["event"] for line in audit.read_text().splitlines()]
    assert events == ["start", "decision", "request", "stop"]

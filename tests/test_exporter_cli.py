"""`trainprof exporter` on the command line: bad input exits 2 with the reason and no
traceback; SIGTERM stops it cleanly with the recording complete."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from trainprof.cli import main
from trainprof.contract import recording
from trainprof.training import identity

from servers import free_port


@pytest.mark.parametrize(
    "args, message",
    [
        (["--web.listen-address", "9945"], "'9945' is not HOST:PORT"),
        (["--web.listen-address", "::1:9945"], "write an IPv6 host in brackets"),
        (["--web.listen-address", ":99999"], "port '99999' is not a number from 0 to 65535"),
        (["--web.telemetry-path", "metrics"], "must start with /"),
        (
            ["--collector.disk.device-exclude", "(loop"],
            "--collector.disk.device-exclude '(loop' is not a regular expression",
        ),
        (["--path.procfs", "/nonexistent"], "--path.procfs /nonexistent has no stat file"),
        (
            [
                "--no-collector.cpu",
                "--no-collector.memory",
                "--no-collector.disk",
                "--no-collector.network",
                "--no-collector.gpu",
            ],
            "every collector is off",
        ),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(args, message, capsys):
    assert main(["exporter", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--datapoint-interval", "fast"], "'fast' is not a duration"),
        (["--datapoint-interval", "0s"], "must be longer than 0s"),
        (["--web.max-connections", "0"], "must be at least 1"),
    ],
)
def test_unparsable_values_are_usage_errors(args, message, capsys):
    with pytest.raises(SystemExit) as raised:
        main(["exporter", *args])
    assert raised.value.code == 2 and message in capsys.readouterr().err


def test_a_bad_rule_configuration_lists_its_problems(tmp_path, capsys):
    config = tmp_path / "rules.yaml"
    config.write_text("rules:\n  - rule: CPUBotleneck\n")
    assert (
        main(
            [
                "exporter",
                "--rules.config",
                str(config),
                "--no-collector.gpu",
                "--web.listen-address",
                "127.0.0.1:0",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--rules.config" in err and "CPUBotleneck" in err and "CPUBottleneck" in err


def test_a_datapoint_interval_the_rules_do_not_assume_is_refused(tmp_path, capsys):
    config = tmp_path / "rules.yaml"
    config.write_text("datapoint_interval: 1s\nrules: [{rule: CPUBottleneck}]\n")
    assert (
        main(
            [
                "exporter",
                "--rules.config",
                str(config),
                "--datapoint-interval",
                "0.5s",
                "--no-collector.gpu",
                "--web.listen-address",
                "127.0.0.1:0",
            ]
        )
        == 2
    )
    assert "disagrees with" in capsys.readouterr().err


def test_a_bad_web_config_and_missing_bcrypt_exit_2(tmp_path, capsys, monkeypatch):
    web = tmp_path / "web.yml"
    web.write_text("tls_server_config: {cert_file: a.crt}\n")
    assert main(["exporter", "--web.config.file", str(web)]) == 2
    assert "tls_server_config.key_file: required for TLS" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "bcrypt", None)
    web.write_text("basic_auth_users: {prometheus: $2y$10$%s}\n" % ("a" * 53))
    assert main(["exporter", "--web.config.file", str(web)]) == 2
    assert "basic_auth_users needs bcrypt, which is not installed" in capsys.readouterr().err


def test_an_unwritable_recording_exits_1(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")  # in the way of the folder: it cannot be created
    assert (
        main(
            [
                "exporter",
                "--no-collector.gpu",
                "--web.listen-address",
                "127.0.0.1:0",
                "--record",
                str(tmp_path / "a-file" / "missing" / "run.jsonl"),
            ]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "cannot write the recording" in err and "Not a directory" in err


def test_identity_comes_from_flags_then_env_then_the_hostname_outside_kubernetes():
    env = {"TRAINPROF_JOB": "bert", "TRAINPROF_NODE": "n7"}
    labels = identity.exporter_labels
    assert labels(env=env) == {"training_job": "bert", "node": "n7"}
    assert labels("n1", "gpt", env=env) == {"training_job": "gpt", "node": "n1"}
    assert labels("", env=env) == {"training_job": "bert"}
    assert labels(env={}, hostname="box") == {"node": "box"}
    kubernetes = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    assert labels(env=kubernetes, hostname="box") == {}
    assert labels(env={**kubernetes, **env}) == {"training_job": "bert", "node": "n7"}


def test_under_slurm_the_exporter_labels_node_and_job_as_the_ranks_do():
    env = {
        "SLURMD_NODENAME": "gpu-n3",
        "SLURM_JOB_NAME": "bert",
        "SLURM_JOB_ID": "812",
        "SLURM_PROCID": "5",
    }
    rank = identity.resolve(env=env, hostname="gpu-n3.cluster.local").labels()
    exporter = identity.exporter_labels(env=env, hostname="gpu-n3.cluster.local")
    assert exporter == {"training_job": "bert-812", "node": "gpu-n3"}
    assert exporter == {k: rank[k] for k in exporter}


def test_sigterm_stops_the_exporter_and_completes_the_recording(tmp_path):
    port = free_port()
    record = tmp_path / "run.jsonl.gz"
    env = {**os.environ, "TRAINPROF_JOB": 'job "with" {quotes}\n'}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainprof.cli",
            "exporter",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--record",
            str(record),
            "--identity.node",
            "n1",
            "--datapoint-interval",
            "0.1s",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    # The hostile job name arrives escaped: quotes and the newline as \" and \n.
    escaped = 'trainprof_samples_total{node="n1",training_job="job \\"with\\" {quotes}\\n"} '
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
                    lines = r.read().decode().splitlines()
                served = [line for line in lines if line.startswith(escaped)]
                if served and float(served[0].split()[-1]) >= 2:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the exporter never served two samples"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "GPU collector unavailable: no NVIDIA driver on this node" in err
    records = [r for _, r in recording.read(str(record))]
    assert records[0]["kind"] == "meta" and records[0]["datapoint_interval"] == 0.1
    hosts = [recording.host_sample(r) for r in records[1:]]
    assert hosts and all(r["node"] == "n1" for r in records[1:])
    assert f"closed with {len(hosts)} samples" in err
    assert len(hosts[-1].cpu_utilization) == os.cpu_count()


def test_exporter_version_and_the_extra_a_missing_module_asks_for(capsys, monkeypatch):
    from trainprof._version import __version__

    with pytest.raises(SystemExit) as exited:
        main(["exporter", "--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"trainprof exporter {__version__}"
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert main(["exporter", "--web.listen-address", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: trainprof exporter needs pynvml, which is not installed: "
        "pip install 'trainprof[exporter]'\n"
    )


def test_the_exporter_serves_its_own_process_metrics():
    import urllib.request

    import trainprof.exporter

    running = trainprof.exporter.start(
        0, address="127.0.0.1", collectors=["memory"], identity={"node": "n1"}
    )
    try:
        with urllib.request.urlopen(running.url, timeout=10) as r:
            body = r.read().decode()
    finally:
        running.stop()
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes"):
        assert f"\n{name} " in body, name

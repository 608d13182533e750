"""`trainprof replay --source ... --collect-interval ...`: what it refuses, and what it prints."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from replay_contract import VERDICT_KEYS
from trainprof.replay import Query, replay
from trainprof.replay.synthetic import write_steps, write_system

START = 1_700_000_000
HOSTS = {"algo-1": {"cores": 2, "gpus": 1, "timeline": [{"gpu_util": 0.03, "cpu": 0.97}]}}


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("job")
    write_system(str(root / "profiler-output"), start=START, duration=240, interval=1, hosts=HOSTS)
    return str(root)


def _replay(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "replay", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--source", "dcgm,nvml"],
            "unknown source 'nvml' (known: trainprof, dcgm, node_exporter)",
        ),
        (["--source", ","], "no source named"),
        (
            ["--source", "trainprof,dcgm,node_exporter"],
            "trainprof with both dcgm and node_exporter",
        ),
        (
            ["--collect-interval", "7s"],
            "--collect-interval 7s is neither a multiple nor a divisor of the scrape interval",
        ),
        (
            ["--source", "dcgm", "--collect-interval", "7s"],
            "--collect-interval 7s is neither a multiple nor a divisor of the scrape interval "
            "(15s)",
        ),
        (["--source", "dcgm", "--collect-interval", "0s"], "'0s' must be longer than 0s"),
        (["--source", "dcgm", "--collect-interval", "30"], "'30' has no unit"),
        (["--source", "dcgm", "--collect-interval", "2h"], "outside 0.1s .. 3600s"),
        (
            ["--source", "dcgm", "--scrape-interval", "1s", "--collect-interval", "50ms"],
            "outside 0.1s .. 3600s",
        ),
    ],
)
def test_bad_sources_and_collect_intervals_are_named_with_exit_2(job, args, message):
    out = _replay(job, *args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_a_source_in_the_rule_configuration_is_checked_too(job, tmp_path):
    config = tmp_path / "rules.yaml"
    config.write_text("source: [dcgm,nvml]\nrules:\n- rule: ProfilerReport\n")
    out = _replay(job, "--rules", str(config))
    assert out.returncode == 2 and "unknown source 'nvml'" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_the_exporter_reading_dcgm_exporter_is_named(job, promtool):
    out = _replay(job, "--collect-interval", "30s")
    assert out.returncode == 0, out.stderr
    assert "GPUs: trainprof's exporter reading dcgm-exporter (collecting every 30s)" in out.stdout
    assert "sources:" not in out.stdout
    out = _replay(job, "--source", "node_exporter", "--collect-interval", "30s")
    assert out.returncode == 0, out.stderr
    assert "sources: node_exporter (their series" in out.stdout
    assert "GPUs: trainprof's exporter reading dcgm-exporter (collecting every 30s)" in out.stdout


def test_dcgm_and_node_exporter_replay_keeps_the_json_contract_and_names_the_sources(job, promtool):
    args = ("--source", "dcgm,node_exporter", "--collect-interval", "30s")
    out = _replay(job, *args, "--json", "-")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert list(doc) == ["rules"] and doc["rules"]
    for verdict in doc["rules"].values():
        assert set(verdict) == VERDICT_KEYS
    table = _replay(job, *args)
    assert table.returncode == 0, table.stderr
    assert (
        "sources: dcgm-exporter (collecting every 30s), node_exporter "
        "(their series synthesised from the recording); alerts evaluated at their groups' "
        "own interval" in table.stdout
    )


def test_source_trainprof_prints_what_replay_printed_without_it(job, promtool):
    plain, named = _replay(job, "--json", "-"), _replay(job, "--source", "trainprof", "--json", "-")
    assert plain.returncode == named.returncode == 0, plain.stderr + named.stderr
    assert plain.stdout == named.stdout
    table = _replay(job, "--source", "trainprof")
    assert "sources:" not in table.stdout


STARVED = {
    "algo-1": {
        "cores": 4,
        "gpus": 2,
        "timeline": [{"gpu_util": [0.03, 0.9], "cpu": [0.97, 0.3, 0.3, 0.3]}],
    }
}


@pytest.mark.parametrize("collect", [None, 30.0])
def test_a_starved_gpu_gets_the_same_verdicts_from_dcgm_and_node_exporter(
    tmp_path, promtool, collect
):
    out = tmp_path / "job" / "profiler-output"
    write_system(str(out), start=START, duration=16 * 60, interval=0.5, hosts=STARVED)
    source = str(tmp_path / "job")
    own = replay(source, None, scrape_interval=15, sources=("trainprof",))
    adapters = replay(
        source,
        None,
        scrape_interval=15,
        sources=("dcgm", "node_exporter"),
        collect_interval=collect,
    )
    fired = {n for n, v in own.rules.items() if v.fired}
    assert {"CPUBottleneck", "LowGPUUtilization", "LoadBalancing"} <= fired
    # LoadBalancing needs each GPU's utilization distribution: not compiled for dcgm.
    assert {n for n, v in adapters.rules.items() if v.fired} == fired - {"LoadBalancing"}
    balance = adapters.rules["LoadBalancing"].status
    assert balance is not None and balance.status == "not_applicable"
    for name in ("CPUBottleneck", "LowGPUUtilization", "BatchSize"):
        # alerts evaluated every minute, as their groups are live, not every 15 s
        assert adapters.rules[name].first_fired_at == own.rules[name].first_fired_at, name
    low = adapters.rules["LowGPUUtilization"]
    assert [a.labels["training_job"] for a in low.alerts] == ["job"]
    assert [(u.labels["node"], u.labels["gpu"]) for u in low.affected] == [("algo-1", "0")]


def test_the_exporter_over_dcgm_exporter_sees_each_collection_late(tmp_path, promtool):
    """GPU 0 idles from 100 to 200 s, and works otherwise; CPU core 0 stays busy. Read
    through a dcgm-exporter collecting every 5 minutes (at 150 s, 450 s, ...: half a period
    out of step with the scrapes), the exporter sees the idle reading of the 150 s collection
    until the next one: a 100 s spell counts as 300 s of CPU bottleneck."""
    hosts = {
        "algo-1": {
            "cores": 2,
            "gpus": 1,
            "timeline": [
                {"gpu_util": 0.95, "cpu": 0.97},
                {"from": 100, "gpu_util": 0.03, "cpu": 0.97},
                {"from": 200, "gpu_util": 0.95, "cpu": 0.97},
            ],
        }
    }
    out = tmp_path / "job" / "profiler-output"
    write_system(str(out), start=START, duration=12 * 60, interval=0.5, hosts=hosts)
    ratio = 'training_job:trainprof_cpu_bottleneck_samples:ratio{cpu_above="0.9",gpu_below="0.1"}'

    def share(collect):
        result = replay(
            str(tmp_path / "job"),
            None,
            scrape_interval=15,
            collect_interval=collect,
            queries=lambda compiled, job, end: {"share": Query(ratio)},
        )
        (samples,) = result.queries["share"].values()
        return float(samples[0][1])

    direct, held = share(None), share(300.0)
    # Samples up to the last scrape, 700 s in.
    assert direct == pytest.approx(100 / 700, abs=0.005)
    assert held == pytest.approx(300 / 700, abs=0.005)


def test_an_adapter_replay_gives_the_same_verdicts_every_time(tmp_path, promtool):
    # The alert groups read trainprof.sources' recordings of the same instant: promtool
    # evaluates groups in a random order unless told, which moved this job's first
    # LowGPUUtilization alert by a minute from one run to the next.
    hosts = {
        "algo-1": {
            "cores": 4,
            "gpus": 1,
            "timeline": [
                {
                    "gpu_util": {"cycle": [0.02] * 60 + [0.95] * 60},
                    "cpu": {"cycle": [0.97] * 60 + [0.4] * 60},
                }
            ],
        }
    }
    out = tmp_path / "job" / "profiler-output"
    write_system(str(out), start=START, duration=20 * 60, interval=0.5, hosts=hosts)
    runs = [
        replay(
            str(tmp_path / "job"),
            None,
            scrape_interval=15,
            sources=("dcgm", "node_exporter"),
            collect_interval=1.0,
        ).as_json()
        for _ in range(4)
    ]
    assert all(run == runs[0] for run in runs[1:])


def test_the_report_replays_through_the_same_sources(tmp_path, promtool):
    out = tmp_path / "job" / "profiler-output"
    write_system(str(out), start=START, duration=16 * 60, interval=0.5, hosts=STARVED)
    summaries = {}
    for source in ("trainprof", "dcgm,node_exporter"):
        html = tmp_path / f"{source}.html"
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "trainprof.cli",
                "report",
                "--replay",
                str(tmp_path / "job"),
                "--source",
                source,
                "-o",
                str(html),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stderr
        wrote = [line for line in (run.stdout + run.stderr).splitlines() if "wrote" in line]
        summaries[source] = wrote[-1].rsplit(": ", 1)[-1]
    # LoadBalancing fires on trainprof's exporter and is not compiled for dcgm
    assert summaries == {
        "trainprof": "job, 4 of 12 rules fired",
        "dcgm,node_exporter": "job, 3 of 11 rules fired",
    }


@pytest.mark.parametrize(
    "sources, ranks", [(("dcgm",), False), (("dcgm",), True), (("node_exporter",), True)]
)
def test_one_adapter_beside_trainprofs_exporter_gets_the_same_verdicts(
    tmp_path, promtool, sources, ranks
):
    # With ranks, their training API serves the GPU assignment that joins node_exporter's
    # nodes (and dcgm's GPUs) to the job; without, dcgm's GPUs join through their pods, and
    # trainprof's exporter carries the same namespace.
    out = tmp_path / "job" / "profiler-output"
    write_system(str(out), start=START, duration=16 * 60, interval=0.5, hosts=STARVED)
    for rank in (0, 1) if ranks else ():
        steps = [("train", START + 30 + 2 * i, START + 31.5 + 2 * i) for i in range(400)]
        write_steps(str(out), "algo-1", rank, steps)
    source = str(tmp_path / "job")
    own = replay(source, None, scrape_interval=15, sources=("trainprof",))
    mixed = replay(source, None, scrape_interval=15, sources=sources)
    expected = {n: v.first_fired_at for n, v in own.rules.items() if v.fired}
    assert {"CPUBottleneck", "LowGPUUtilization", "BatchSize"} <= set(expected)
    if "dcgm" in sources:
        del expected["LoadBalancing"]
    assert {n: v.first_fired_at for n, v in mixed.rules.items() if v.fired} == expected

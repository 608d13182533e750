"""`trainprof compare` and the compare dashboard against a real Prometheus holding two jobs,
one of them run twice: every compare dashboard query returns data for the two jobs and for
the job's two runs, and `trainprof compare --prometheus` compares jobs and runs with the
numbers Prometheus holds."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time

import pytest

from trainprof.dashboards import compare, panel_queries
from trainprof.dashboards.panels import grafanalib_json, modernize
from trainprof.dashboards.queries import interpolate

from servers import query, try_query

BUILTINS = {"__rate_interval": "4s", "__range": "2m", "__interval": "1s"}
RUN_SECONDS = 25


def _targets(path, jobs) -> None:
    path.write_text(
        json.dumps(
            [
                {"targets": t, "labels": {"namespace": j.namespace}}
                for j in jobs
                for t in [j.targets]
            ]
        )
    )


def _config() -> str:
    return (
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "rule_files: [rules.yaml]\n"
        "scrape_configs:\n"
        "- job_name: trainprof\n"
        "  file_sd_configs: [{files: [targets.json], refresh_interval: 1s}]\n"
    )


def _up(base: str, count: int, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        up = query(base, "sum(up)")["data"]["result"]
        if up and float(up[0]["value"][1]) >= count:
            return
        assert time.monotonic() < deadline, f"fewer than {count} targets up"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def two_jobs(prometheus_bin, tmp_path_factory):
    """Prometheus scraping bert-large for a minute, and bert-base twice: a first run, then
    a second with new processes (a new start time); yields (base URL, the rule file)."""
    from conftest import LIVE_RULES
    from trainprof.generation.render import to_yaml
    from trainprof.rules.compiler import compile_rules
    from trainprof.rules.config import load_config

    from live_job import scripted_job
    from servers import prometheus

    workdir = tmp_path_factory.mktemp("compare-prometheus")
    rules = to_yaml({"groups": compile_rules(load_config(LIVE_RULES)).groups})
    (workdir / "live.yaml").write_text(to_yaml(LIVE_RULES))
    with contextlib.ExitStack() as stack:
        large = stack.enter_context(scripted_job("bert-large"))
        first = stack.enter_context(contextlib.ExitStack())
        run = first.enter_context(scripted_job("bert-base"))
        _targets(workdir / "targets.json", [large, run])
        base = stack.enter_context(
            prometheus(prometheus_bin, workdir, _config(), {"rules.yaml": rules})
        )
        _up(base, 8)
        time.sleep(RUN_SECONDS)
        # The first run's processes end; a second run of bert-base starts (a new start time).
        first.close()
        second = stack.enter_context(scripted_job("bert-base"))
        _targets(workdir / "targets.json", [large, second])
        _up(base, 8)
        time.sleep(RUN_SECONDS)
        yield base, workdir / "live.yaml"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", *args], capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize(
    "a, b, offset", [("bert-base", "bert-large", "1ms"), ("bert-base", "bert-base", "30s")]
)
def test_every_compare_dashboard_query_returns_data(two_jobs, a, b, offset):
    base, config_path = two_jobs
    from trainprof.rules.files import read_config

    data = modernize(grafanalib_json(compare.dashboard(read_config(str(config_path)))))
    values = {"namespace": "team-a", "job_a": a, "job_b": b, "a_offset": offset}
    queries = panel_queries(data)
    assert len(queries) >= 20
    empty = []
    for title, ref, expr in queries:
        result, error = try_query(base, interpolate(expr, values, BUILTINS))
        assert error is None, f"{title} [{ref}]: {error}"
        if not result:
            empty.append(title)
    assert not empty, f"no data: {empty}"


def test_compare_two_jobs_in_prometheus(two_jobs):
    base, config_path = two_jobs
    result = cli(
        "compare", "bert-base", "bert-large", "--prometheus", base,
        "--rules", str(config_path), "--json", "-",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert [r["label"] for r in doc["runs"]] == ["A", "B"]
    assert [r["training_job"] for r in doc["runs"]] == ["bert-base", "bert-large"]
    for rule, by_run in doc["rules"].items():
        assert set(by_run) == {"A", "B"}, rule
        assert {v["status"] for v in by_run.values()} <= {
            "fired", "quiet", "no_data", "not_applicable"
        }  # fmt: skip
    # The live job's second rank stalls (step outliers): both jobs fire StepOutlier.
    assert doc["rules"]["StepOutlier"]["A"]["status"] == "fired"
    # B's steps are as Prometheus counts them at the end of its range.
    steps = query(base, 'sum(trainprof_training_steps_total{training_job="bert-large"})')
    counted = float(steps["data"]["result"][0]["value"][1])
    assert doc["runs"][1]["steps"] == pytest.approx(counted, rel=0.1)
    assert doc["step_time"]["runs"]["B"]["mean"] > 0
    # Same sizes (2 nodes, 3 GPUs, 2 ranks each): nothing said about sizes.
    assert not any(n.startswith("sizes differ") for n in doc["not_comparable"])


def test_compare_two_runs_of_one_job_name(two_jobs, tmp_path):
    base, config_path = two_jobs
    page = tmp_path / "runs.html"
    result = cli(
        "compare", "bert-base", "bert-base", "--prometheus", base,
        "--rules", str(config_path), "--json", "-", "-o", str(page),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    first, second = doc["runs"]
    assert first["training_job"] == second["training_job"] == "bert-base"
    # A is the earlier run, B the latest, each cut to its own span.
    assert first["start"] < second["start"]
    assert first["end"] <= second["start"] + 2
    assert "runs of bert-base" in " ".join(doc["notes"])
    assert page.read_text().count("bert-base") >= 2


def test_one_run_cannot_be_compared_with_itself(two_jobs):
    base, config_path = two_jobs
    result = cli(
        "compare", "bert-large", "bert-large", "--prometheus", base,
        "--rules", str(config_path),
    )  # fmt: skip
    assert result.returncode == 2
    assert "bert-large has 1 run(s)" in result.stderr and "Traceback" not in result.stderr


def test_a_offset_moves_a_back_in_time(two_jobs):
    """Shifted an hour back, before either job existed, every query of A alone is empty and
    every query of B alone still has data: the offset reaches every one of A's selectors."""
    base, config_path = two_jobs
    from trainprof.rules.files import read_config

    data = modernize(grafanalib_json(compare.dashboard(read_config(str(config_path)))))
    values = {"namespace": "team-a", "job_a": "bert-base", "job_b": "bert-large", "a_offset": "1h"}
    sides = {"a": 0, "b": 0}
    for title, ref, expr in panel_queries(data):
        has_a, has_b = "$job_a" in expr, "$job_b" in expr
        if has_a == has_b:
            continue  # B against A: both
        result, error = try_query(base, interpolate(expr, values, BUILTINS))
        assert error is None, f"{title} [{ref}]: {error}"
        if has_a:
            # "or vector(0)" answers for an empty count
            assert (
                not result
                or result == [{"metric": {}, "value": result[0]["value"]}]
                and (result[0]["value"][1] == "0")
            ), f"{title}: A has data an hour back"
            sides["a"] += 1
        else:
            assert result, f"{title}: B has no data"
            sides["b"] += 1
    assert sides["a"] == sides["b"] >= 10

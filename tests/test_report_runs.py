"""A job name used by two runs (a resubmitted job): the report tells them apart by their
start time and reports the latest, or the one asked for, never both mixed. The two runs
are backfilled into a real Prometheus as TSDB blocks (promtool tsdb create-blocks-from)."""

from __future__ import annotations

import subprocess
import time

import pytest

from trainprof.report import ReportError, from_prometheus
from trainprof.rules.config import default_config

from servers import prometheus

JOB = "resubmitted"


def _openmetrics(runs: list[tuple[float, float]]) -> str:
    """Two ranks per run, scraped every 15 s: start time, steps and sampler ticks."""
    families = {
        "trainprof_training_start_timestamp_seconds": "gauge",
        "trainprof_training_steps": "counter",
        "trainprof_samples": "counter",
    }
    lines = []
    for family, kind in families.items():
        lines.append(f"# TYPE {family} {kind}")
        for rank in (0, 1):
            for started, ended in runs:
                t = started
                while t <= ended:
                    labels = f'training_job="{JOB}",node="n1",rank="{rank}",mode="train"'
                    if family == "trainprof_training_start_timestamp_seconds":
                        name, value = family, started + rank
                    elif family == "trainprof_training_steps":
                        name, value = family + "_total", (t - started) * 2
                    else:
                        name, value = family + "_total", (t - started) * 2
                        labels = f'training_job="{JOB}",node="n1",rank="{rank}"'
                    lines.append(f"{name}{{{labels}}} {value:.3f} {t:.0f}")
                    t += 15
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def two_runs(prometheus_bin, promtool, tmp_path_factory):
    now = float(int(time.time()) // 60 * 60)
    first = (now - 4 * 3600, now - 3 * 3600)
    second = (now - 2 * 3600, now - 1 * 3600)
    workdir = tmp_path_factory.mktemp("runs")
    (workdir / "data").mkdir()
    (workdir / "series.om").write_text(_openmetrics([first, second]))
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", "series.om", "data"],
        cwd=workdir,
        check=True,
        capture_output=True,
        timeout=120,
    )
    with prometheus(prometheus_bin, workdir, "global: {scrape_interval: 15s}\n", {}) as base:
        yield base, now, first, second


def test_the_latest_run_is_reported_and_the_runs_are_named(two_runs):
    base, now, first, second = two_runs
    collected = from_prometheus(base, JOB, default_config(), now=now)
    assert second[0] - 1 <= collected.start and collected.end <= second[1] + 16
    assert any("2 runs of resubmitted" in n and "run 2" in n for n in collected.notes)
    steps = collected.results["summary.steps"]
    # Two ranks at 2 steps/s for an hour: one run's steps, not both runs'.
    assert sum(points[-1][1] for _, points in steps) == pytest.approx(2 * 2 * 3600, rel=0.02)


def test_an_earlier_run_is_reported_when_asked_for(two_runs):
    base, now, first, second = two_runs
    by_number = from_prometheus(base, JOB, default_config(), now=now, run="1")
    assert first[0] - 1 <= by_number.start and by_number.end < second[0]
    by_time = from_prometheus(base, JOB, default_config(), now=now, run=f"{first[0]:.0f}")
    assert (by_time.start, by_time.end) == (by_number.start, by_number.end)
    with pytest.raises(ReportError, match=r"--run 3: no such run; the runs are 1 \("):
        from_prometheus(base, JOB, default_config(), now=now, run="3")


def test_the_cli_reports_the_run_asked_for(two_runs, tmp_path):
    import sys

    base, now, first, second = two_runs
    out = tmp_path / "r.html"
    result = subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "report", "--prometheus", base, "--job", JOB]
        + ["--run", "1", "--to", f"{now:.0f}", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "This report covers run 1" in result.stderr

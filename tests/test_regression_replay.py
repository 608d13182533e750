"""The regression rules replayed: a recording of two runs of one job (rank 0 started twice,
as a resubmitted job's recordings put side by side) fires StepTimeRegression and
GPUUtilizationRegression when the second run is slower or its GPU less busy, and stays
quiet when it is not; a recording of one run has no baseline (no data)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from synthetic_runs import write_run

START = 1_780_000_000
RULES = """\
scrape_interval: 15s
rules:
- rule: StepTimeRegression
  parameters: {window: 2, patience: 3}
- rule: GPUUtilizationRegression
  parameters: {window: 2, patience: 3}
"""


def replay(source, tmp_path) -> dict:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    result = subprocess.run(
        [sys.executable, "-m", "trainprof.cli", "replay", str(source), "--rules", str(rules)]
        + ["--json", "-"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["rules"] | {"_notes": result.stderr}


@pytest.mark.parametrize(
    "second, fired",
    [
        ((0.13, 0.55), {"StepTimeRegression", "GPUUtilizationRegression"}),
        ((0.103, 0.88), set()),
    ],
    ids=["slower-and-idler", "unchanged"],
)
def test_a_second_run_is_judged_against_the_first(tmp_path, promtool, second, fired):
    runs = tmp_path / "runs"
    runs.mkdir()
    write_run(runs / "run1.jsonl.gz", START, 12, 0.1, 0.9)
    write_run(runs / "run2.jsonl.gz", START + 13 * 60, 12, *second)
    verdicts = replay(runs, tmp_path)
    assert "restarted processes" in verdicts["_notes"]
    for rule in ("StepTimeRegression", "GPUUtilizationRegression"):
        v = verdicts[rule]
        assert v["status"] == ("fired" if rule in fired else "quiet"), (rule, v)
        assert v["fired"] == (rule in fired)
        if rule in fired:
            assert v["alerts"][0]["labels"]["baseline"] == "previous_run"
            # It fires in the second run, once its patience (3 minutes) has passed.
            assert START + 16 * 60 <= v["first_fired_at"] <= START + 19 * 60, v
    measured = verdicts["StepTimeRegression"]["measured"]
    assert measured["threshold"] == pytest.approx(1.1)
    assert measured["value"] == pytest.approx(second[0] / 0.1, rel=0.05)


def test_one_run_has_no_baseline(tmp_path, promtool):
    write_run(tmp_path / "run.jsonl.gz", START, 12, 0.3, 0.1)
    verdicts = replay(tmp_path / "run.jsonl.gz", tmp_path)
    for rule in ("StepTimeRegression", "GPUUtilizationRegression"):
        assert verdicts[rule]["status"] == "no_data", verdicts[rule]

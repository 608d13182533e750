"""Every tensor rule gives SageMaker's verdict on trials written by smdebug's own writer.

The trials (tests/data/smdebug-trials/, made by tests/fixtures_src/make_smdebug_trials.py with
smdebug 1.0.34's FileWriter at its defaults and its PyTorch hook) are replayed by trainprof; the
expected first firing step comes from SageMaker's rule semantics (tests/sagemaker_oracle.py,
RULE-SEMANTICS.md section 4) judged on what smdebug's own reader read from the same trial.
Each rule has at least two cases written to fire and two written to stay quiet, with
non-default parameters.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from sagemaker_oracle import RULES, first_fired
from trainprof.replay.tensors import replay_trial
from trainprof.rules.config import load_config

DATA = Path(__file__).resolve().parent / "data" / "smdebug-trials"
CASES = json.loads((DATA / "cases.json").read_text())


def _id(case: dict) -> str:
    return f"{case['rule']}/{case['case']}"


def test_every_rule_has_two_firing_and_two_quiet_cases():
    intents = Counter((c["rule"], c["intent"]) for c in CASES)
    for rule in RULES:
        assert intents[(rule, "fires")] >= 2 and intents[(rule, "quiet")] >= 2, rule


@pytest.mark.tools
@pytest.mark.parametrize("case", CASES, ids=_id)
def test_trainprof_replay_fires_at_sagemakers_step(case, promtool, tmp_path):
    trial = DATA / case.get("trial", f"{case['rule']}/{case['case']}")
    parameters = dict(case["parameters"])
    if "other_trials" in parameters:  # SimilarAcrossRuns: the other run's trial
        parameters["other_trials"] = str(DATA / parameters["other_trials"])
    expected = first_fired(case["rule"], trial, parameters)
    if case["intent"] == "fires":
        assert expected is not None, "the case was written to fire"
    elif case["intent"] == "quiet":
        assert expected is None, "the case was written to stay quiet"
    config = load_config({"rules": [{"rule": case["rule"], "parameters": parameters}]}, "case")
    result = replay_trial(str(trial), config, promtool=promtool, workdir=str(tmp_path))
    assert not [n for n in result.notes if "checksum" in n or "could not be decoded" in n]
    verdict = result.rules[case["rule"]]
    assert verdict.first_fired_step == expected

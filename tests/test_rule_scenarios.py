"""Every scenario in tests/scenarios runs through the real `promtool test rules`.

Each case is its own test, but the cases of one scenario file run in one promtool process
(starting promtool takes longer than most cases take to run): the first case of a file to
run writes every selected case of that file into a directory of its own and runs `promtool
test rules` over all of them; each case then reads its own block of promtool's report. The
`xdist_group` mark keeps a file's cases on one pytest-xdist worker (`--dist loadgroup`), so
no file runs twice.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from scenario import load_cases, load_yaml, promtool_files

CASES = load_cases()
BATCHES = pytest.StashKey[dict]()
BLOCK = re.compile(r"^Unit Testing: +(\S+)\n(.*?)(?=^Unit Testing: |\Z)", re.MULTILINE | re.DOTALL)
# What an alert may carry: the job, the rule's own labels, the thresholds a bottleneck
# rule was compiled for and the baseline a regression rule compares with. No GPU, node, rank
# or other unit: one alert per job and rule.
JOB_AND_RULE = {
    "namespace",
    "training_job",
    "rule",
    "severity",
    "trainprof_rule_version",
    "reason",
    "affects",
    "cpu_above",
    "iowait_above",
    "gpu_below",
    "baseline",
}


def scenario_file(case_id: str) -> str:
    return case_id.split(": ", 1)[0]


def _batch(request, promtool: str, tmp_path_factory, scenario: str) -> tuple[Path, dict, str]:
    """Run the selected cases of `scenario`, once per session: (the directory of the files,
    case id -> its block of promtool's report, the whole report)."""
    done = request.config.stash.setdefault(BATCHES, {})
    if scenario not in done:
        selected = [
            item.callspec.params["case_id"]
            for item in request.session.items
            if item.originalname == "test_scenario"
            and item.module is request.module
            and scenario_file(item.callspec.params["case_id"]) == scenario
        ]
        cases = dict(CASES)
        workdir = tmp_path_factory.mktemp(scenario)
        files = {}
        for i, case_id in enumerate(selected):
            (workdir / str(i)).mkdir()
            test_file = promtool_files(cases[case_id], workdir / str(i))
            files[str(test_file.relative_to(workdir))] = case_id
            (workdir / str(i) / "case").write_text(case_id)
        result = subprocess.run(
            [promtool, "test", "rules", *files],
            cwd=workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # promtool writes a failure's details to stderr
            text=True,
            timeout=300,
        )
        blocks = {files[m[1]]: m[2] for m in BLOCK.finditer(result.stdout) if m[1] in files}
        done[scenario] = (workdir, blocks, result.stdout)
    return done[scenario]


@pytest.mark.parametrize(
    "case_id",
    [pytest.param(i, id=i, marks=pytest.mark.xdist_group(scenario_file(i))) for i, _ in CASES],
)
def test_scenario(case_id, promtool, tmp_path_factory, request):
    workdir, blocks, report = _batch(request, promtool, tmp_path_factory, scenario_file(case_id))
    # promtool compares the alerts exactly: expecting only these labels pins what fires
    for check in _expected_alerts(workdir, case_id):
        for alert in check.get("exp_alerts", []):
            assert set(alert["exp_labels"]) <= JOB_AND_RULE, alert
    assert case_id in blocks, (
        f"promtool's report (files in {workdir}) has no {case_id!r}:\n{report}"
    )
    if blocks[case_id].strip() != "SUCCESS":
        pytest.fail(
            f"promtool test rules failed for {case_id!r} (files in {workdir}):\n{blocks[case_id]}",
            pytrace=False,
        )


def _expected_alerts(workdir: Path, case_id: str) -> list[dict]:
    for case in workdir.glob("*/case"):
        if case.read_text() == case_id:
            test = load_yaml((case.parent / "test.yaml").read_text())["tests"][0]
            return test.get("alert_rule_test", [])
    return []


def test_each_case_has_a_name_of_its_own_in_its_file():
    names = [case_id for case_id, _ in CASES]
    assert len(set(names)) == len(names), sorted(n for n in names if names.count(n) > 1)

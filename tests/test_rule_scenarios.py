"""Every scenario in tests/scenarios runs through the real `promtool test rules`."""

from __future__ import annotations

import subprocess

import pytest

from scenario import load_cases, promtool_files

CASES = load_cases()


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_scenario(case, promtool, tmp_path):
    test_file = promtool_files(case, tmp_path)
    result = subprocess.run(
        [promtool, "test", "rules", test_file.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"promtool test rules failed for {case['name']!r} (files in {tmp_path}):\n"
        f"{result.stdout}\n{result.stderr}"
    )

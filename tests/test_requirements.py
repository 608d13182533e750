"""A missing dependency fails under TRAINPROF_REQUIRE_TOOLS=1 instead of skipping, so CI
cannot go green having run nothing that matters."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

PROBE = """
from conftest import require_module, skip_or_fail

def test_a_missing_module():
    require_module("trainprof_no_such_module")

def test_a_missing_backend():
    skip_or_fail("keras was imported with the jax backend")
"""


def _run(tmp_path, require: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != "TRAINPROF_REQUIRE_TOOLS"}
    if require:
        env["TRAINPROF_REQUIRE_TOOLS"] = require
    env["PYTHONPATH"] = str(HERE) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )


def test_missing_modules_skip_on_a_laptop(tmp_path):
    result = _run(tmp_path, None)
    assert result.returncode == 0 and "2 skipped" in result.stdout, result.stdout


def test_missing_modules_fail_when_tools_are_required(tmp_path):
    result = _run(tmp_path, "1")
    assert result.returncode == 1 and "2 failed" in result.stdout, result.stdout
    assert "trainprof_no_such_module is not installed" in result.stdout

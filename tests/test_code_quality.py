"""The habits `make check` enforces, enforced by the test suite too: `ruff check`,
`ruff format --check` and `mypy` (configured in pyproject.toml) report nothing on src/."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest


def _tool(module: str) -> list[str]:
    if importlib.util.find_spec(module) is None:
        message = f"{module} is not installed (pip install -e '.[test]')"
        if os.environ.get("TRAINPROF_REQUIRE_TOOLS") == "1":
            pytest.fail(message + "; TRAINPROF_REQUIRE_TOOLS=1 makes this a failure")
        pytest.skip(message)
    return [sys.executable, "-m", module]


def _clean(command: list[str], root) -> None:
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(command[2:])}:\n{result.stdout}{result.stderr}"


def test_ruff_finds_nothing(root):
    _clean(_tool("ruff") + ["check", "--no-cache", "src"], root)


def test_ruff_format_would_change_nothing(root):
    _clean(_tool("ruff") + ["format", "--check", "--no-cache", "src"], root)


def test_mypy_finds_no_type_errors(root):
    _clean(_tool("mypy"), root)


def test_a_finding_fails_the_check(root, tmp_path):
    """The checks above can fail: the same commands on a file with a lint error, a
    formatting error and a type error report each one."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\ndef half(x: int) -> str:\n    return x/2\n")
    for command in (
        _tool("ruff") + ["check", "--no-cache", str(bad)],
        _tool("ruff") + ["format", "--check", "--no-cache", str(bad)],
        _tool("mypy") + ["--cache-dir", str(tmp_path / "c"), "--config-file", "", str(bad)],
    ):
        result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=600)
        assert result.returncode != 0, " ".join(command[2:])

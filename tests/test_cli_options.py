"""Command-line options that could be read two ways say which one counts."""

from __future__ import annotations

import subprocess
import sys


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainprof.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_record_refuses_a_second_file_given_with_record(tmp_path):
    result = cli("record", str(tmp_path / "a.jsonl"), "--record", str(tmp_path / "b.jsonl"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "writes to its FILE argument" in result.stderr and "b.jsonl" in result.stderr
    assert not (tmp_path / "a.jsonl").exists() and not (tmp_path / "b.jsonl").exists()


def test_replay_format_is_explained_in_help():
    result = cli("replay", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "--format {auto,sagemaker,trainprof}" in text
    assert "a file is a recording, a folder is searched for SageMaker output" in text

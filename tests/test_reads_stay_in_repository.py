"""The suite's read audit (tests/read_audit.py) fails a test that reads outside the repository.

A probe session runs the suite's own conftest (`-p conftest`) over tests that read a file
outside the repository in each way a test could: open, a directory listing, a path caught in
try/except, a symlink to outside, a path handed to a non-Python child, a Python
grandchild that computes the path itself, a read at import, and ../shared beside the
repository where one is there. Each must fail, and a read inside the repository must pass.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import read_audit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHARED = ROOT.parent / "shared" / "real-exporters" / "README.md"

PROBE = """
import os, subprocess, sys
from pathlib import Path

OUTSIDE = Path({outside!r})
INSIDE = Path({inside!r})
BESIDE = Path({beside!r})

def test_open():
    OUTSIDE.read_text()

def test_listing():
    os.listdir(OUTSIDE.parent)

def test_a_caught_read():
    try:
        open(OUTSIDE, "rb").close()
    except OSError:
        pass

def test_a_symlink_to_outside(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(OUTSIDE)
    link.read_text()

def test_a_path_handed_to_a_child():
    subprocess.run(["cat", str(OUTSIDE)], check=True, capture_output=True)

def test_a_python_grandchild():
    code = "import os; open(os.path.join(%r, %r)).read()" % (str(OUTSIDE.parent), OUTSIDE.name)
    subprocess.run([sys.executable, "-c", code], check=True)

def test_shared_beside_the_repository():
    shared = Path({shared!r})
    if shared.is_file():
        shared.read_text()
    else:
        OUTSIDE.read_text()  # no ../shared here: the same read of another outside file

def test_beside_in_the_temporary_directory():
    BESIDE.read_text()  # a checkout under /tmp reading ../shared

def test_inside():
    INSIDE.read_text()
    os.listdir(INSIDE.parent)
    subprocess.run(["cat", str(INSIDE)], check=True, capture_output=True)
"""


def _probe(tmp_path: Path, import_time_read: bool = False) -> subprocess.CompletedProcess:
    # The probe session's system temporary directory is tmp/ (its own is inside it), so
    # outside/ and tmp/shared/ are outside everything it may read; the repository is this one.
    outside = tmp_path / "outside" / "secret.txt"
    beside = tmp_path / "tmp" / "shared" / "data.txt"
    for path in (outside, beside):
        path.parent.mkdir(parents=True)
        path.write_text("not the repository's")
    probe = tmp_path / "tmp" / read_audit.SESSION_TMP / "probe"
    probe.mkdir(parents=True)
    source = PROBE.format(
        outside=str(outside),
        inside=str(HERE / "data" / "README.md"),
        shared=str(SHARED),
        beside=str(beside),
    )
    if import_time_read:
        source += "\nOUTSIDE.read_text()\n"
    (probe / "test_probe.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINPROF_READ_AUDIT")}
    env.update(TMPDIR=str(tmp_path / "tmp"), PYTHONPATH=str(HERE))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-rA"]
        + ["-q", str(probe)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=probe,
        env=env,
    )


def test_every_way_of_reading_outside_fails_and_reading_inside_passes(tmp_path):
    result = _probe(tmp_path)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    failed = set(re.findall(r"^ERROR test_probe.py::(\w+)", out, re.M))
    assert failed == {
        "test_open",
        "test_listing",
        "test_a_caught_read",
        "test_a_symlink_to_outside",
        "test_a_path_handed_to_a_child",
        "test_a_python_grandchild",
        "test_shared_beside_the_repository",
        "test_beside_in_the_temporary_directory",
    }, out
    assert re.search(r"^PASSED test_probe.py::test_inside$", out, re.M), out
    secret = str(tmp_path / "outside" / "secret.txt")
    assert f"{secret} (open in child process" in out  # the grandchild's own hook saw it
    if SHARED.is_file():
        assert f"{SHARED} (open)" in out


def test_a_read_at_import_fails_the_session(tmp_path):
    result = _probe(tmp_path, import_time_read=True)
    assert result.returncode != 0
    assert "read outside the repository" in result.stdout + result.stderr


def test_the_allowed_places_are_the_repository_tools_and_temporary_files():
    audit = read_audit.Audit(str(ROOT))
    assert audit.inside(str(ROOT / "tests" / "data" / "README.md"))
    assert audit.inside(sys.executable) and audit.inside("/usr/bin/env")
    assert audit.inside(os.path.expanduser("~/.cache/pip"))
    assert not audit.inside(str(ROOT.parent / "shared" / "real-sagemaker"))
    assert not audit.inside(os.path.expanduser("~/notes.txt"))
    # The session's temporary directory is its own, not the system's, where a clone and
    # ../shared beside it may lie.
    assert Path(tempfile.gettempdir()).name == read_audit.SESSION_TMP
    assert not audit.inside(str(Path(tempfile.gettempdir()).parent / "shared"))

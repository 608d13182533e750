"""What an installed trainprof tells the tools around it: typed (PEP 561), classified, linked."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import tomllib

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

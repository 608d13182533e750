"""Shared fixtures: the real Prometheus tools, found on PATH.

A missing tool skips its tests on a laptop, but fails them when TRAINPROF_REQUIRE_TOOLS=1
(which `make test` and CI set), so CI can never go green having run nothing that matters.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite the golden files under tests/golden/ from the current "
                          "output (review the diff before committing)")


@pytest.fixture
def update_golden(request) -> bool:
    return request.config.getoption("--update-golden")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} is not installed (scripts/install-tools.sh installs it)"
    if os.environ.get("TRAINPROF_REQUIRE_TOOLS") == "1":
        pytest.fail(message + "; TRAINPROF_REQUIRE_TOOLS=1 makes this a failure")
    pytest.skip(message)


@pytest.fixture(scope="session")
def promtool() -> str:
    return _tool("promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return _tool("prometheus")


@pytest.fixture(scope="session")
def amtool() -> str:
    return _tool("amtool")


@pytest.fixture(scope="session")
def alertmanager_bin() -> str:
    # Debian names the server binary prometheus-alertmanager.
    return _tool("prometheus-alertmanager")


@pytest.fixture(scope="session")
def openssl() -> str:
    return _tool("openssl")


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT

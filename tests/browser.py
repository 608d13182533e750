"""Headless Chromium (Debian's package) for tests: a page's DOM after rendering, a
screenshot. Each call gets a fresh profile directory and leaves no process behind."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def _run(chromium: str, *args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [chromium, *FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )


def dump_dom(chromium: str, page: Path) -> str:
    result = _run(chromium, "--dump-dom", page.resolve().as_uri())
    assert result.returncode == 0 and result.stdout, result.stderr[-2000:]
    return result.stdout


def screenshot(
    chromium: str, page: Path, png: Path, width: int = 1200, height: int = 3000
) -> bytes:
    result = _run(
        chromium, f"--window-size={width},{height}", f"--screenshot={png}", page.resolve().as_uri()
    )
    assert result.returncode == 0 and png.is_file(), result.stderr[-2000:]
    return png.read_bytes()

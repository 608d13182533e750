"""Headless Chromium (Debian's package) for tests: a page's DOM after rendering, what a script
measured on it, a screenshot and its pixels. Each call gets a fresh profile directory and
leaves no process behind."""

from __future__ import annotations

import html
import json
import re
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import numpy as np

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


def measured(chromium: str, page: Path, script: str, width: int, height: int) -> dict:
    """What `script` (JavaScript that sets `data-measured` on <body> to a JSON text) measured
    on `page`, rendered in a `width` x `height` window. The page's Content-Security-Policy is
    taken out so the script may run; the layout is the page's own."""
    text = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / page.name
        copy.write_text(text.replace("</body>", f"<script>{script}</script></body>"))
        result = _run(chromium, f"--window-size={width},{height}", "--dump-dom", copy.as_uri())
    found = re.search(r'data-measured="([^"]*)"', result.stdout)
    assert found, result.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


def pixels(png: bytes) -> np.ndarray:
    """A PNG screenshot (8-bit RGB or RGBA, not interlaced, as Chromium writes them) as a
    height x width x channels array: zlib and the five PNG row filters, undone."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks, header = 8, [], None
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos : pos + 8])
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", png[pos + 8 : pos + 8 + length])
        elif kind == b"IDAT":
            chunks.append(png[pos + 8 : pos + 8 + length])
        pos += 12 + length
    assert header is not None, "a PNG without IHDR"
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and not interlace, header
    bpp = 3 if color == 2 else 4
    stride = width * bpp
    raw = zlib.decompress(b"".join(chunks))
    image = np.zeros((height, stride), dtype=np.int32)
    prev = np.zeros(stride, dtype=np.int32)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        row = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        if kind == 1:  # Sub: each byte adds the one a pixel to its left
            row = np.cumsum(row.reshape(-1, bpp), axis=0).reshape(-1) & 255
        elif kind == 2:  # Up
            row = (row + prev) & 255
        elif kind in (3, 4):  # Average, Paeth: each byte depends on the decoded one before
            row = np.array(_unfilter(kind, row.tolist(), prev.tolist(), bpp), dtype=np.int32)
        image[y] = row
        prev = row
    return image.reshape(height, width, bpp).astype(np.uint8)


def _unfilter(kind: int, row: list[int], up: list[int], bpp: int) -> list[int]:
    for i in range(len(row)):
        a = row[i - bpp] if i >= bpp else 0
        b = up[i]
        if kind == 3:
            row[i] = (row[i] + ((a + b) >> 1)) & 255
            continue
        c = up[i - bpp] if i >= bpp else 0
        pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
        row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    return row

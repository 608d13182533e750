"""trainprof's one version (`trainprof._version`), written where hand-written files name it.

`--version`, the wheel and the chart's `version`/`appVersion` read `trainprof._version`
directly; the exporter image's tag is named in files the generator does not write whole
(exporter/Dockerfile), so `make generate` rewrites the tag there and `--check` fails when one
lags behind.

    >>> print(stamp('docker build -t trainprof/exporter:0.0.9 .', "1.2.3"))
    docker build -t trainprof/exporter:1.2.3 .
    >>> print(stamp('LABEL org.opencontainers.image.version="0.0.9"', "1.2.3"))
    LABEL org.opencontainers.image.version="1.2.3"
    >>> print(stamp('docker build --build-arg VERSION=0.0.9 .', "1.2.3"))
    docker build --build-arg VERSION=1.2.3 .
    >>> print(stamp('LABEL org.opencontainers.image.version="${VERSION}"', "1.2.3"))
    LABEL org.opencontainers.image.version="${VERSION}"
"""

from __future__ import annotations

import os
import re

from trainprof import _version

IMAGE = "trainprof/exporter"
# Repository-relative files that name the version; each is checked only where it exists.
STAMPED = ("exporter/Dockerfile",)
# The image's tag, a `--build-arg VERSION=` in a documented command and a literal OCI version
# label; a label that reads the build argument (`"${VERSION}"`) is left alone.
_PATTERNS = (
    re.compile(r"(?<![\w/.-])(" + re.escape(IMAGE) + r":)[0-9][0-9A-Za-z.+-]*"),
    re.compile(r"(--build-arg VERSION=)[0-9][0-9A-Za-z.+-]*"),
    re.compile(r'(org\.opencontainers\.image\.version=")[0-9][^"]*(?=")'),
)


def image(version: str | None = None) -> str:
    """The exporter image's reference: `trainprof/exporter:<version>` (default: trainprof's)."""
    return f"{IMAGE}:{version or _version.__version__}"


def stamp(text: str, version: str | None = None) -> str:
    """`text` with every image tag and OCI version label set to `version` (default:
    trainprof's)."""
    version = version or _version.__version__
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + version, text)
    return text


def stamped(root: str) -> dict[str, str]:
    """Path -> its text with the version stamped, for each STAMPED file under `root`."""
    out = {}
    for path in STAMPED:
        try:
            with open(os.path.join(root, path), encoding="utf-8") as f:
                out[path] = stamp(f.read())
        except FileNotFoundError:
            continue
    return out

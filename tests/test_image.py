"""The exporter's OCI image (`make image`, scripts/build_image.py), built here and run.

The image is built from Debian's packages and the wheel, without a container registry; its
exporter is started from the image's own configuration (entrypoint, command, user,
environment) and scraped by a real Prometheus beside the exporter of this checkout's pip
install, and both must serve the same series. podman runs it where podman can run
containers; where it cannot (this project's CI sandbox: crun may not set RLIMIT_NOFILE), the
layout is unpacked with `umoci unpack` and its root filesystem run under chroot as the
image's non-root user, with the host's /proc mounted at /host/proc as the chart mounts it.
The runner used is printed; TRAINPROF_IMAGE_RUNNER=chroot takes the chroot path even where
podman works.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import skip_or_fail

from servers import free_port, get_json, prometheus

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.tools, pytest.mark.slow(reason="builds the image from Debian's packages")]
UNPACKED_LIMIT = 150 * 2**20  # python:3.11-slim unpacks to about that


def _version() -> str:
    text = (ROOT / "src" / "trainprof" / "_version.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def _build(out: Path, *options: str) -> dict:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_image.py"), "--out", str(out)]
        + ["--lock", "prefer", *options],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((out / "image.json").read_text())


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> tuple[Path, dict]:
    missing = [t for t in ("mmdebstrap", "umoci", "chroot", "unshare") if not shutil.which(t)]
    if missing:
        skip_or_fail(f"{', '.join(missing)} not installed (scripts/install-tools.sh)")
    if os.geteuid() != 0:
        skip_or_fail("building the image needs root (mmdebstrap --mode=root)")
    out = tmp_path_factory.mktemp("image")
    return out, _build(out)


def _blob(layout: Path, digest: str) -> Path:
    return layout / "blobs" / digest.replace(":", "/", 1)


def _config(out: Path) -> dict:
    layout = out / "oci"
    (entry,) = json.loads((layout / "index.json").read_text())["manifests"]
    manifest = json.loads(_blob(layout, entry["digest"]).read_text())
    return json.loads(_blob(layout, manifest["config"]["digest"]).read_text())


@pytest.fixture(scope="module")
def bundle(image, tmp_path_factory) -> Path:
    out, info = image
    where = tmp_path_factory.mktemp("bundle") / "b"
    result = subprocess.run(
        ["umoci", "unpack", "--image", f"{out / 'oci'}:{info['tag']}", str(where)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return where


def test_the_image_is_tagged_with_the_package_version_and_runs_as_nobody(image):
    out, info = image
    assert info["tag"] == _version()
    (entry,) = json.loads((out / "oci" / "index.json").read_text())["manifests"]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == _version()
    assert entry["digest"] == info["digest"]
    config = _config(out)["config"]
    assert config["User"] == "65534:65534"
    assert config["Entrypoint"] == ["/usr/local/bin/trainprof", "exporter"]
    assert config["Cmd"] == ["--path.procfs=/host/proc"]
    assert "9945/tcp" in config["ExposedPorts"]
    assert config["Labels"]["org.opencontainers.image.version"] == _version()
    assert (out / info["archive"]).stat().st_size > info["packed_bytes"]


def test_the_image_is_small_and_holds_no_compiler_shell_or_package_manager(image, bundle):
    out, info = image
    rootfs = bundle / "rootfs"
    on_disk = sum(p.stat().st_size for p in rootfs.rglob("*") if p.is_file() and not p.is_symlink())
    assert on_disk == info["unpacked_bytes"]
    assert info["unpacked_bytes"] < UNPACKED_LIMIT, info["unpacked_bytes"]
    assert info["packed_bytes"] < info["unpacked_bytes"] / 2
    names = {
        p.name for d in ("usr/bin", "usr/sbin", "usr/local/bin") for p in (rootfs / d).iterdir()
    }
    for tool in (
        "gcc",
        "cc",
        "c++",
        "ld",
        "as",
        "make",
        "sh",
        "bash",
        "dash",
        "apt",
        "dpkg",
        "pip",
    ):
        assert tool not in names, tool
    assert not list(rootfs.glob("usr/lib/gcc*")), "a compiler's support files"
    assert {"python3", "trainprof", "python"} <= names
    passwd = (rootfs / "etc" / "passwd").read_text()
    assert "nobody:x:65534:65534:" in passwd
    # Every package is listed with its version: Debian's from the lock, Python's from the
    # wheels' metadata.
    assert info["packages"]["debian"]["python3-minimal"]
    assert info["packages"]["python"]["trainprof"] == _version()
    assert {"prometheus_client", "psutil", "nvidia-ml-py", "PyYAML", "bcrypt"} <= set(
        info["packages"]["python"]
    )


def test_two_builds_of_one_commit_are_the_same_image(image, tmp_path):
    """The second from nothing: its own Debian download and root filesystem."""
    _, first = image
    second = _build(tmp_path / "again", "--cache", str(tmp_path / "cache"))
    assert second["digest"] == first["digest"]
    assert (tmp_path / "again" / first["archive"]).read_bytes() == (
        image[0] / first["archive"]
    ).read_bytes()


# --- running it ------------------------------------------------------------------------------


def _podman(*args: str) -> list[str]:
    """`podman run` as this machine allows: podman's default open-files limit (1048576) is
    above the hard limit a sandbox may impose, which the runtime then cannot set, so the
    limits are given within it; runc where installed (crun refuses hybrid cgroups)."""
    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 65536)
    runtime = ["--runtime", "runc"] if shutil.which("runc") else []
    return ["podman", *runtime, "run", "--rm", "--ulimit", f"nofile={nofile}:{nofile}"] + [
        "--ulimit",
        "nproc=4096:4096",
        *args,
    ]


def _podman_works(image: str) -> str | None:
    """None when podman runs this image here (with no network: it fetches nothing at start),
    else why not."""
    if os.environ.get("TRAINPROF_IMAGE_RUNNER") == "chroot":
        return "TRAINPROF_IMAGE_RUNNER=chroot"
    if not shutil.which("podman"):
        return "podman is not installed"
    probe = subprocess.run(
        _podman("--network=none", image, "--version"), capture_output=True, text=True, timeout=180
    )
    if probe.returncode == 0 and f"trainprof exporter {_version()}" in probe.stdout:
        return None
    return (probe.stderr.strip().splitlines() or ["podman run failed"])[-1]


def _start_from_image(out: Path, info: dict, bundle: Path, port: int, log, request):
    """The image's exporter on 127.0.0.1:`port`; returns (process, runner)."""
    listen = f"--web.listen-address=127.0.0.1:{port}"
    image = f"oci-archive:{out / info['archive']}"
    why_not = _podman_works(image)
    if why_not is None:
        name = f"trainprof-test-{os.getpid()}-{port}"
        request.addfinalizer(
            lambda: subprocess.run(["podman", "rm", "-f", name], capture_output=True)
        )
        argv = _podman("--name", name, "--network=host", "-v", "/proc:/host/proc:ro", image)
        proc = subprocess.Popen(
            [*argv, "--path.procfs=/host/proc", listen], stdout=log, stderr=subprocess.STDOUT
        )
        return proc, "podman" + (" (runc)" if shutil.which("runc") else "")
    # The runtime spec umoci wrote from the image's configuration.
    spec = json.loads((bundle / "config.json").read_text())
    process = spec["process"]
    user = process["user"]
    rootfs = bundle / spec["root"]["path"]
    argv = [*process["args"], listen]
    # A mount namespace of its own for /proc (a container runtime mounts one; psutil reads it
    # at import) and the host's, read-only, where the chart mounts it; then the image's
    # environment only, its user and its root.
    script = (
        'mkdir -p "$0/proc" && mount --bind /proc "$0/proc" && '
        'mount --bind /proc "$0/host/proc" && mount -o remount,bind,ro "$0/host/proc" && '
        'u=$((4 + $2)); exec "$1" -i "${@:4:$2}" "$3" --userspec="${!u}" "$0" "${@:u+1}"'
    )
    env = process["env"]
    spec_user = f"{user['uid']}:{user['gid']}"
    proc = subprocess.Popen(
        [shutil.which("unshare"), "--mount", "--propagation", "private", "bash", "-c", script]
        + [str(rootfs), shutil.which("env"), str(len(env)), shutil.which("chroot")]
        + [*env, spec_user, *argv],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return proc, f"chroot as uid {user['uid']} (podman: {why_not})"


def _series(base: str, job: str) -> set[tuple]:
    data = get_json(f"{base}/api/v1/series?match[]={{job=%22{job}%22}}")["data"]
    return {
        tuple(sorted((k, v) for k, v in s.items() if k not in ("job", "instance"))) for s in data
    }


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_prometheus_scrapes_the_same_series_from_the_image_as_from_the_pip_install(
    image, bundle, prometheus_bin, tmp_path, request
):
    out, info = image
    image_port, pip_port = free_port(), free_port()
    image_log, pip_log = (tmp_path / "image.log").open("w"), (tmp_path / "pip.log").open("w")
    request.addfinalizer(image_log.close)
    request.addfinalizer(pip_log.close)
    from_image, runner = _start_from_image(out, info, bundle, image_port, image_log, request)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter:
        reporter.write_line(f"\ntest_image: the image's exporter ran under {runner}")
    from_pip = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainprof",
            "exporter",
            f"--web.listen-address=127.0.0.1:{pip_port}",
        ],
        stdout=pip_log,
        stderr=subprocess.STDOUT,
    )
    config = (
        "global: {scrape_interval: 1s, scrape_timeout: 900ms}\nscrape_configs:\n"
        f"  - job_name: image\n    static_configs: [{{targets: ['127.0.0.1:{image_port}']}}]\n"
        f"  - job_name: pip\n    static_configs: [{{targets: ['127.0.0.1:{pip_port}']}}]\n"
    )
    try:
        with prometheus(prometheus_bin, tmp_path, config, {}) as base:
            deadline = time.monotonic() + 60
            while True:
                up = get_json(f"{base}/api/v1/query?query=up")["data"]["result"]
                ups = {r["metric"]["job"]: r["value"][1] for r in up}
                # Two scrapes each: the exporters' first sample has been taken by then.
                counts = get_json(f"{base}/api/v1/query?query=count_over_time(up%5B1m%5D)")["data"][
                    "result"
                ]
                seen = {r["metric"]["job"]: int(r["value"][1]) for r in counts}
                if ups == {"image": "1", "pip": "1"} and min(seen.values(), default=0) >= 3:
                    break
                assert from_image.poll() is None, (tmp_path / "image.log").read_text()
                assert time.monotonic() < deadline, (ups, (tmp_path / "image.log").read_text())
                time.sleep(0.5)
            image_series, pip_series = _series(base, "image"), _series(base, "pip")
            build = get_json(f"{base}/api/v1/query?query=trainprof_exporter_build_info")["data"][
                "result"
            ]
    finally:
        _stop(from_image)
        _stop(from_pip)
    names = {dict(s)["__name__"] for s in image_series}
    assert "trainprof_cpu_core_utilization_ratio" in names and "trainprof_samples_total" in names
    assert len(image_series) > 50
    assert image_series == pip_series, (
        sorted(image_series - pip_series)[:5],
        sorted(pip_series - image_series)[:5],
    )
    assert {r["metric"]["version"] for r in build} == {_version()}
    log = (tmp_path / "image.log").read_text()
    assert "Traceback" not in log, log

#!/usr/bin/env python3
"""Builds the exporter's OCI image without a container registry: `make image`.

    build/image/oci/            OCI image layout, tag = the package version
                                (src/trainprof/_version.py); two layers: Debian's python3
                                (mmdebstrap, no shell, no apt, no compiler), then the wheel
                                with its locked dependencies
    build/image/image.json      tag, digest, sizes (packed and unpacked), build time, and the
                                Debian and Python packages inside, each with its version
    build/image/trainprof-exporter-<version>.oci.tar   the layout as one file (release asset)

Reproducible: the Debian packages are the versions in exporter/image/debian-packages.lock,
the Python ones the hashes in exporter/image/python-requirements.lock, every file's time is
SOURCE_DATE_EPOCH (default: the last commit's), so two builds from one commit have one
digest. A locked Debian version the archive no longer serves fails the build and says to run
`make image-lock` (with --lock=prefer it is reported and the current version used instead).
Nothing is fetched when the image runs.

Needs root (mmdebstrap's root mode and chroot), mmdebstrap and umoci (Debian packages;
scripts/install-tools.sh installs them). The Debian root filesystem and the downloaded
packages are cached under build/image-cache/, keyed by the lock, so a rebuild repacks only.

    python3 scripts/build_image.py [--out build/image] [--lock strict|prefer] [--relock]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMAGE_DIR = ROOT / "exporter" / "image"
DEBIAN_LOCK = IMAGE_DIR / "debian-packages.lock"
PYTHON_LOCK = IMAGE_DIR / "python-requirements.lock"
SUITE = "bookworm"
PYTHON = "3.11"
# The packages the image asks for; the lock holds them with every dependency, pinned.
DEBIAN_ROOTS = ("python3-minimal", f"libpython{PYTHON}-stdlib")
# Installed by the exporter's documented options beyond the [exporter] extra: basic auth.
PYTHON_EXTRA = ("bcrypt>=4",)
PIP_PLATFORM = [
    "--only-binary=:all:",
    "--platform=manylinux2014_x86_64",
    f"--python-version={PYTHON}",
    "--implementation=cp",
    f"--abi=cp{PYTHON.replace('.', '')}",
]
SITE = f"usr/local/lib/python{PYTHON}/dist-packages"
# What a running exporter never uses: the package manager, documentation, translations.
PRUNE = (
    "etc/apt",
    "etc/dpkg",
    "etc/alternatives",
    "etc/cron.daily",
    "etc/logrotate.d",
    "etc/hostname",
    "etc/resolv.conf",
    "var/lib/apt",
    "var/lib/dpkg",
    "var/cache",
    "var/log",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/lintian",
    "usr/share/locale",
    "usr/share/dpkg",
    "usr/share/polkit-1",
    "usr/bin/dpkg",
    "usr/bin/dpkg-deb",
    "usr/bin/dpkg-divert",
    "usr/bin/dpkg-maintscript-helper",
    "usr/bin/dpkg-query",
    "usr/bin/dpkg-realpath",
    "usr/bin/dpkg-split",
    "usr/bin/dpkg-statoverride",
    "usr/bin/dpkg-trigger",
    "usr/bin/update-alternatives",
    "usr/sbin/start-stop-daemon",
    "usr/lib/dpkg",
)
USER = "65534:65534"
PORT = 9945
# Bumped when the base's recipe changes, so a cached base root filesystem is rebuilt.
BASE_RECIPE = "5"


class BuildError(Exception):
    """A build step failed; the message says which and what to do."""


def say(text: str) -> None:
    print(f"image: {text}", file=sys.stderr, flush=True)


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise BuildError(f"{argv[0]} {' '.join(argv[1:3])} ... failed:\n{tail}")
    return result


def version() -> str:
    text = (ROOT / "src" / "trainprof" / "_version.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if not match:
        raise BuildError("src/trainprof/_version.py has no __version__ line")
    return match.group(1)


def source_date_epoch() -> int:
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    result = subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%ct"], capture_output=True, text=True
    )
    return int(result.stdout.strip()) if result.returncode == 0 and result.stdout.strip() else 0


def iso(epoch: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


# --- the Debian layer ---------------------------------------------------------------------


def lock_epoch(path: Path) -> int | None:
    """The time the lock was written, which the Debian layer's files carry: the layer's
    digest then changes with the lock only, and a registry keeps one copy across releases."""
    match = re.search(r"^# epoch (\d+)$", path.read_text(), re.M) if path.exists() else None
    return int(match.group(1)) if match else None


def read_lock(path: Path) -> list[str]:
    if not path.exists():
        return []
    lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [line for line in lines if line]


def mmdebstrap(rootfs: Path, includes: list[str], debs: Path, epoch: int) -> None:
    """Extracts `includes` and their dependencies into `rootfs`; the .debs in `debs` are
    used instead of downloading them again, and what was downloaded is added there."""
    debs.mkdir(parents=True, exist_ok=True)
    run(
        [
            "mmdebstrap",
            "--mode=root",
            "--variant=extract",
            "--quiet",
            f"--include={','.join(includes)}",
            f'--setup-hook=mkdir -p "$1"/var/cache/apt/archives && cp -a {debs}/. '
            '"$1"/var/cache/apt/archives/',
            f'--extract-hook=cp -a "$1"/var/cache/apt/archives/. {debs}/',
            SUITE,
            str(rootfs),
        ],
        env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)},
    )


def packages_in(debs: Path) -> dict[str, str]:
    """Package -> version of the .deb files in `debs`."""
    found: dict[str, str] = {}
    for deb in sorted(debs.glob("*.deb")):
        fields = run(["dpkg-deb", "--showformat=${Package} ${Version}", "--show", str(deb)])
        name, ver = fields.stdout.split()
        found[name] = ver
    return dict(sorted(found.items()))


def resolve(rootfs: Path, cache: Path, epoch: int) -> dict[str, str]:
    """Extracts the current versions of DEBIAN_ROOTS' closure; returns what it took."""
    fresh = cache / "debs-resolving"
    shutil.rmtree(fresh, ignore_errors=True)
    mmdebstrap(rootfs, list(DEBIAN_ROOTS), fresh, epoch)
    packages = packages_in(fresh)
    run(["cp", "-a", f"{fresh}/.", f"{cache / 'debs'}/"])
    shutil.rmtree(fresh)
    return packages


def base_rootfs(cache: Path, lock_mode: str, relock: bool, epoch: int) -> tuple[Path, dict]:
    """The pruned Debian root filesystem (cached) and its package versions."""
    locked = [] if relock else read_lock(DEBIAN_LOCK)
    key = hashlib.sha256(("\n".join(locked) + BASE_RECIPE + SUITE).encode()).hexdigest()[:16]
    where = cache / f"base-{key}"
    if locked and (where / "packages.json").exists():
        say(f"Debian layer from the cache ({where.name})")
        return where / "rootfs", json.loads((where / "packages.json").read_text())
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    rootfs = where / "rootfs"
    (cache / "debs").mkdir(exist_ok=True)
    started = time.monotonic()
    note = ""
    base_epoch = lock_epoch(DEBIAN_LOCK)
    if base_epoch is None:
        base_epoch = int(time.time())
    if not locked:
        packages = resolve(rootfs, cache, epoch)
        if [f"{n}={v}" for n, v in packages.items()] != read_lock(DEBIAN_LOCK):
            base_epoch = int(time.time())  # new versions: the layer's time says when
        write_debian_lock(packages, base_epoch)
    else:
        try:
            mmdebstrap(rootfs, locked, cache / "debs", epoch)
            packages = dict(line.split("=", 1) for line in locked)
        except BuildError as e:
            if lock_mode != "prefer" or "was not found" not in str(e):
                raise BuildError(
                    f"{e}\nThe Debian archive no longer serves a version in "
                    f"{DEBIAN_LOCK.relative_to(ROOT)}: run `make image-lock` and commit the "
                    "new lock (a security update moved it)."
                ) from None
            note = "a locked version is gone from the archive; built with the current ones"
            say(f"warning: {note} (run `make image-lock`)")
            shutil.rmtree(rootfs, ignore_errors=True)
            packages = resolve(rootfs, cache, epoch)
    say(f"mmdebstrap: {time.monotonic() - started:.1f}s")
    prune(rootfs)
    # Compiled once here: the image's user cannot write __pycache__ at run time.
    compile_python(rootfs, f"/usr/lib/python{PYTHON}")
    clamp_times(rootfs, base_epoch)
    record = {"debian": packages, "note": note, "epoch": base_epoch}
    (where / "packages.json").write_text(json.dumps(record, indent=1) + "\n")
    return rootfs, record


def write_debian_lock(packages: dict[str, str], epoch: int) -> None:
    lines = [
        f"# Debian {SUITE} packages in the exporter image, with every dependency.",
        "# Written by `make image-lock` (scripts/build_image.py --relock); do not edit.",
        f"# epoch {epoch}",
        *(f"{name}={ver}" for name, ver in sorted(packages.items())),
    ]
    DEBIAN_LOCK.write_text("\n".join(lines) + "\n")
    say(f"wrote {DEBIAN_LOCK.relative_to(ROOT)} ({len(packages)} packages)")


def prune(rootfs: Path) -> None:
    for rel in PRUNE:
        path = rootfs / rel
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    for sub in rootfs.glob(f"usr/lib/python{PYTHON}/**/__pycache__"):
        shutil.rmtree(sub, ignore_errors=True)
    # The users a container runtime resolves; no login shell exists.
    (rootfs / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    (rootfs / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    for name in ("tmp", "proc", "host/proc", "root"):
        (rootfs / name).mkdir(parents=True, exist_ok=True)
    os.chmod(rootfs / "tmp", 0o1777)
    os.chmod(rootfs / "root", 0o700)


# --- the Python layer ---------------------------------------------------------------------


def build_wheel(work: Path, epoch: int) -> Path:
    dist = work / "wheel"
    shutil.rmtree(dist, ignore_errors=True)
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--disable-pip-version-check", "-w", str(dist), str(ROOT)],
        env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)},
        cwd=work,
    )
    (wheel,) = dist.glob("trainprof-*.whl")
    return wheel


def python_requirements() -> list[str]:
    """The [exporter] extra of pyproject.toml, and what its documented options need."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["optional-dependencies"]["exporter"])
    names = {re.split(r"[<>=!~ \[]", r, maxsplit=1)[0].lower() for r in wanted}
    wanted += [r for r in PYTHON_EXTRA if re.split(r"[<>=]", r)[0] not in names]
    return [r for r in wanted if not r.startswith("trainprof")] + list(project["dependencies"])


def write_python_lock(work: Path) -> None:
    """Resolves the requirements for the image's Python and platform; pins them by hash."""
    where = work / "download"
    shutil.rmtree(where, ignore_errors=True)
    run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
        + PIP_PLATFORM
        + ["-d", str(where), *python_requirements()]
    )
    lines = [
        f"# Python packages in the exporter image (CPython {PYTHON}, manylinux x86_64).",
        "# Written by `make image-lock` (scripts/build_image.py --relock); do not edit.",
    ]
    for wheel in sorted(where.glob("*.whl"), key=lambda p: p.name.lower()):
        name, ver = wheel.name.split("-")[:2]
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        lines.append(f"{name.replace('_', '-').lower()}=={ver} --hash=sha256:{digest}")
    PYTHON_LOCK.write_text("\n".join(lines) + "\n")
    say(f"wrote {PYTHON_LOCK.relative_to(ROOT)} ({len(lines) - 2} packages)")


def python_layer(rootfs: Path, wheel: Path) -> dict[str, str]:
    site = rootfs / SITE
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    pip += ["--no-deps", "--no-compile", "--target", str(site)]
    run(pip + PIP_PLATFORM + ["--require-hashes", "-r", str(PYTHON_LOCK)])
    run(pip + [str(wheel)])
    shutil.rmtree(site / "bin", ignore_errors=True)  # scripts with the build host's shebang
    # pip records where the wheel came from (a path on the build host): not part of the image.
    for direct in site.glob("*.dist-info/direct_url.json"):
        direct.unlink()
        record = direct.parent / "RECORD"
        lines = record.read_text().splitlines(keepends=True)
        record.write_text(
            "".join(x for x in lines if not x.startswith(f"{direct.parent.name}/direct_url.json,"))
        )
    bindir = rootfs / "usr" / "local" / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    script = bindir / "trainprof"
    script.write_text(
        "#!/usr/bin/python3\nimport sys\n\nfrom trainprof.cli import main\n\nsys.exit(main())\n"
    )
    script.chmod(0o755)
    (bindir / "python").symlink_to("/usr/bin/python3")
    compile_python(rootfs, f"/{SITE}")
    found = {}
    for meta in sorted(site.glob("*.dist-info/METADATA")):
        text = meta.read_text(errors="replace")
        name = re.search(r"^Name: (.+)$", text, re.M)
        ver = re.search(r"^Version: (.+)$", text, re.M)
        if name and ver:
            found[name.group(1).strip()] = ver.group(1).strip()
    return found


def compile_python(rootfs: Path, where: str) -> None:
    """Byte-compiles `where` with the image's own Python, keyed by source hash (not time)."""
    run(
        ["chroot", str(rootfs), "/usr/bin/python3", "-m", "compileall", "-q", "-j", "0"]
        + ["--invalidation-mode", "unchecked-hash", where],
    )


# --- assembling ---------------------------------------------------------------------------


def clamp_times(tree: Path, epoch: int, unless: int | None = None) -> None:
    """Every file's time to `epoch`, but those already at `unless` (the lower layer's)."""
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in [*dirnames, *filenames, None]:
            path = os.path.join(dirpath, name) if name else dirpath
            if unless is None or os.lstat(path).st_mtime != unless:
                os.utime(path, (epoch, epoch), follow_symlinks=False)


def umoci(*args: str) -> None:
    run(["umoci", *args])


def assemble(
    out: Path, base: Path, base_epoch: int, wheel: Path, tag: str, epoch: int
) -> dict[str, str]:
    layout = out / "oci"
    bundle = out / "bundle"
    shutil.rmtree(layout, ignore_errors=True)
    shutil.rmtree(bundle, ignore_errors=True)
    image = f"{layout}:{tag}"
    created = iso(epoch)
    umoci("init", "--layout", str(layout))
    umoci("new", "--image", image)
    umoci("unpack", "--image", image, str(bundle))
    rootfs = bundle / "rootfs"
    run(["cp", "-a", f"{base}/.", f"{rootfs}/"])
    umoci(
        "repack",
        "--refresh-bundle",
        "--history.created",
        created,
        "--history.created_by",
        f"mmdebstrap --variant=extract {SUITE}: {', '.join(DEBIAN_ROOTS)} (exporter/image)",
        "--image",
        image,
        str(bundle),
    )
    python = python_layer(rootfs, wheel)
    clamp_times(rootfs, epoch, unless=base_epoch)
    umoci(
        "repack",
        "--history.created",
        created,
        "--history.created_by",
        f"trainprof {tag} wheel and exporter/image/python-requirements.lock",
        "--image",
        image,
        str(bundle),
    )
    labels = {
        "org.opencontainers.image.title": "trainprof exporter",
        "org.opencontainers.image.version": tag,
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.source": "https://github.com/trainprof/trainprof",
        "org.opencontainers.image.created": created,
    }
    config = ["config", "--image", image, "--created", created, "--history.created", created]
    config += ["--history.created_by", "umoci config (scripts/build_image.py)"]
    config += ["--config.user", USER, "--config.workingdir", "/"]
    config += ["--config.entrypoint", "/usr/local/bin/trainprof", "--config.entrypoint", "exporter"]
    config += ["--config.cmd", "--path.procfs=/host/proc", "--config.exposedports", f"{PORT}/tcp"]
    for env in (
        "PATH=/usr/local/bin:/usr/bin:/bin",
        "NVIDIA_DRIVER_CAPABILITIES=utility",
        "PYTHONDONTWRITEBYTECODE=1",
    ):
        config += ["--config.env", env]
    for key, value in labels.items():
        config += ["--config.label", f"{key}={value}"]
    umoci(*config)
    umoci("gc", "--layout", str(layout))
    shutil.rmtree(bundle)
    return python


def sizes(layout: Path) -> dict[str, int | str]:
    index = json.loads((layout / "index.json").read_text())
    (entry,) = index["manifests"]
    blob = lambda d: layout / "blobs" / d.replace(":", "/", 1)
    manifest = json.loads(blob(entry["digest"]).read_text())
    packed = entry["size"] + manifest["config"]["size"] + sum(x["size"] for x in manifest["layers"])
    unpacked = 0
    import gzip
    import tarfile

    for layer in manifest["layers"]:
        with gzip.open(blob(layer["digest"])) as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
            unpacked += sum(m.size for m in tar if m.isfile())
    return {
        "digest": entry["digest"],
        "packed_bytes": packed,
        "unpacked_bytes": unpacked,
        "layers": len(manifest["layers"]),
    }


def archive(layout: Path, target: Path, epoch: int) -> None:
    """The layout as one tar (`skopeo copy oci-archive:FILE docker://...`), reproducibly."""
    import tarfile

    def reset(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = epoch
        info.mode = 0o755 if info.isdir() else 0o644
        return info

    with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(layout.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(layout)), recursive=False, filter=reset)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "build" / "image"))
    parser.add_argument("--cache", default=str(ROOT / "build" / "image-cache"))
    parser.add_argument(
        "--lock",
        choices=("strict", "prefer"),
        default="strict",
        help="strict (default): a locked Debian version the archive lacks fails the build; "
        "prefer: it is reported and the current version used",
    )
    parser.add_argument(
        "--relock", action="store_true", help="resolve the current versions and rewrite the locks"
    )
    args = parser.parse_args(argv)
    missing = [tool for tool in ("mmdebstrap", "umoci", "dpkg-deb") if not shutil.which(tool)]
    if missing:
        print(
            f"error: {', '.join(missing)} not installed: run scripts/install-tools.sh "
            f"(apt-get install {' '.join(missing)})",
            file=sys.stderr,
        )
        return 2
    if os.geteuid() != 0:
        print("error: the image build needs root (mmdebstrap --mode=root, chroot)", file=sys.stderr)
        return 2
    out, cache = Path(args.out), Path(args.cache)
    out.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    epoch = source_date_epoch()
    tag = version()
    try:
        if args.relock or not PYTHON_LOCK.exists():
            write_python_lock(cache)
        base, packages = base_rootfs(cache, args.lock, args.relock, epoch)
        wheel = build_wheel(cache, epoch)
        python = assemble(out, base, packages["epoch"], wheel, tag, epoch)
        info: dict = {"tag": tag, "source_date_epoch": epoch, **sizes(out / "oci")}
        name = f"trainprof-exporter-{tag}.oci.tar"
        archive(out / "oci", out / name, epoch)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    info["archive"] = name
    info["build_seconds"] = round(time.monotonic() - started, 1)
    info["packages"] = {"debian": packages["debian"], "python": python}
    if packages.get("note"):
        info["lock_note"] = packages["note"]
    (out / "image.json").write_text(json.dumps(info, indent=1) + "\n")
    mib = lambda n: f"{n / 2**20:.1f} MiB"
    print(
        f"trainprof/exporter:{tag}  {info['digest'][:19]}  "
        f"packed {mib(info['packed_bytes'])}, unpacked {mib(info['unpacked_bytes'])}, "
        f"{info['layers']} layers, built in {info['build_seconds']}s\n"
        f"  {out / 'oci'}:{tag}  (skopeo copy oci:{out / 'oci'}:{tag} "
        f"docker://REGISTRY/trainprof/exporter:{tag})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fail a test that reads outside the repository (../shared, a sibling checkout, a home file).

A clone of the repository must pass its own tests with nothing beside it, so every file a
test reads comes from the repository (tests/data holds the real data), from the Python and
tools it runs on, or from a temporary directory. `sys.addaudithook` sees each `open`,
directory listing and process start of the test session; a path outside those places is
recorded, and the test during which it happened fails once it has run (a test that catches
the OSError or never looks at what it read fails all the same). Python child processes run
the same hook (tests/read_audit_site/sitecustomize.py, through PYTHONPATH) and append what
they find to a log the session reads; an outside path handed to any child process, Python or
not, in its arguments, environment or working directory, counts as read.

Allowed: the repository, the session's temporary directory (TMPDIR is set to
<temporary directory>/trainprof-tests for the session and its children, so a checkout under
/tmp with ../shared beside it is still caught), the interpreter's prefixes and site
directories, the system directories below, and dot-entries of the home directory (caches and
tool configuration such as ~/.cache/pip).
"""

from __future__ import annotations

import json
import os
import site
import sys
import tempfile
import threading

SESSION_TMP = "trainprof-tests"  # the session's temporary directory, inside the system's
ROOT_ENV = "TRAINPROF_READ_AUDIT_ROOT"
LOG_ENV = "TRAINPROF_READ_AUDIT_LOG"
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "read_audit_site")
SYSTEM = (
    "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/proc", "/sys",
    "/dev", "/run", "/var", "/opt", "/snap", "/nix",
)  # fmt: skip
# Audit events that name a path read (or listed), with the indexes of their path arguments.
PATH_EVENTS = {
    "open": (0,),
    "os.listdir": (0,),
    "os.scandir": (0,),
    "glob.glob": (0,),
    "shutil.copyfile": (0,),
    "shutil.copytree": (0,),
    "shutil.make_archive": (1,),
}
SPAWN_EVENTS = ("subprocess.Popen", "os.posix_spawn", "os.exec")


class Audit:
    """The places a session may read, and the outside paths it was seen to touch."""

    def __init__(self, root: str, log: str | None = None):
        self.root = os.path.realpath(root)
        self.log = log
        home = os.path.realpath(os.path.expanduser("~"))
        self.home = home if home != "/" else None
        places = [self.root, tempfile.gettempdir(), *SYSTEM]
        places += [sys.prefix, sys.base_prefix, sys.exec_prefix]
        places += site.getsitepackages() + [site.getusersitepackages()]
        self.allowed = tuple(sorted({os.path.realpath(p) for p in places if p}))
        self.environ = dict(os.environ)  # what the session inherited is not the tests' doing
        self.found: list[tuple[str, str]] = []  # (event, path)
        self._cache: dict[str, bool] = {}
        self._busy = threading.local()

    def inside(self, path: str) -> bool:
        """Whether reading `path` (absolute or relative to the working directory) is allowed."""
        path = os.path.abspath(path)
        known = self._cache.get(path)
        if known is not None:
            return known
        real = os.path.realpath(path)
        ok = any(real == p or real.startswith(p.rstrip("/") + "/") for p in self.allowed)
        if not ok and self.home and real.startswith(self.home + "/"):
            ok = real[len(self.home) + 1 :].startswith(".")
        ok = ok or real == self.home
        if len(self._cache) > 50_000:
            self._cache.clear()
        self._cache[path] = ok
        return ok

    def hook(self, event: str, args: tuple) -> None:
        if event not in PATH_EVENTS and event not in SPAWN_EVENTS:
            return
        if getattr(self._busy, "on", False):
            return
        self._busy.on = True
        try:
            for path in self._paths(event, args):
                if not self.inside(path):
                    self._record(event, path)
        except Exception:  # an odd argument must never break the test's own call
            pass
        finally:
            self._busy.on = False

    def _paths(self, event: str, args: tuple) -> list[str]:
        if event in PATH_EVENTS:
            out = []
            for i in PATH_EVENTS[event]:
                value = args[i] if i < len(args) else None
                if isinstance(value, (str, bytes, os.PathLike)):
                    out.append(os.fsdecode(os.fspath(value)))
            return out
        # A child process: absolute paths that exist, in its arguments, in the environment
        # entries the test set, and its working directory.
        words: list[str] = []
        if event == "subprocess.Popen":
            _, argv, cwd, env = args
            argv = [argv] if isinstance(argv, (str, bytes, os.PathLike)) else argv or []
            words += [os.fsdecode(os.fspath(a)) for a in argv]
            words += [os.fsdecode(os.fspath(cwd))] if cwd is not None else []
        else:
            _, argv, env = args[0], args[1], args[2] if len(args) > 2 else None
            words += [os.fsdecode(os.fspath(a)) for a in argv or []]
        for key, value in (env if env is not None else os.environ).items():
            key, value = os.fsdecode(key), os.fsdecode(value)
            if self.environ.get(key) != value:
                words.append(value)
        out = []
        for word in words:
            for part in (word, *word.split("=", 1)[1:], *word.split(os.pathsep)):
                if part.startswith("/") and part.strip("/") and os.path.exists(part):
                    out.append(part)
        return out

    def _record(self, event: str, path: str) -> None:
        self.found.append((event, path))
        if self.log:
            with open(self.log, "a", encoding="utf-8") as f:
                f.write(json.dumps([event, path, os.getpid(), sys.argv[:3]]) + "\n")


def install_in_child() -> None:
    """Called by tests/read_audit_site/sitecustomize.py in a child Python the tests started."""
    root, log = os.environ.get(ROOT_ENV), os.environ.get(LOG_ENV)
    if root and log:
        sys.addaudithook(Audit(root, log).hook)


class Plugin:
    """The pytest side: installs the hook, and fails the test during which an outside path
    was touched (in this process or a child), or the session for reads outside any test."""

    def __init__(self, root: str):
        self.root = root
        self.log = ""
        self.audit: Audit | None = None
        self._seen = 0  # entries of audit.found already given to a test
        self._logged = 0  # bytes of the child log already read
        self.outside_tests: list[str] = []

    def start(self) -> None:
        # The session's own temporary directory, so that the temporary directory is not
        # where a checkout and ../shared beside it may lie (a CI clone under /tmp).
        temporary = tempfile.gettempdir()
        if os.path.basename(temporary) != SESSION_TMP:  # not already set: a pytest-xdist
            temporary = os.path.join(temporary, SESSION_TMP)  # worker inherits its TMPDIR
        os.makedirs(temporary, exist_ok=True)
        os.environ["TMPDIR"] = tempfile.tempdir = temporary
        self.audit = Audit(self.root)
        fd, self.log = tempfile.mkstemp(prefix="read-audit-", suffix=".jsonl")
        os.close(fd)
        os.environ[ROOT_ENV] = self.audit.root
        os.environ[LOG_ENV] = self.log
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (SITE_DIR, os.environ.get("PYTHONPATH")) if p
        )
        self.audit.environ = dict(os.environ)
        sys.addaudithook(self.audit.hook)

    def stop(self) -> None:
        if self.log:
            os.unlink(self.log)
            self.log = ""

    def take(self) -> list[str]:
        """What was touched since the last call, here and in child processes."""
        if self.audit is None:
            return []
        new = [f"{path} ({event})" for event, path in self.audit.found[self._seen :]]
        self._seen = len(self.audit.found)
        if not self.log:
            return new
        with open(self.log, encoding="utf-8") as f:
            f.seek(self._logged)
            lines = f.read()
            self._logged = f.tell()
        for line in lines.splitlines():
            event, path, pid, argv = json.loads(line)
            new.append(f"{path} ({event} in child process {pid}: {' '.join(argv)})")
        return list(dict.fromkeys(new))

    def message(self, paths: list[str]) -> str:
        listed = "\n  ".join(paths[:20])
        return (
            f"read outside the repository {self.root} (tests read their data from "
            f"tests/data; tests/read_audit.py says what is allowed):\n  {listed}"
        )

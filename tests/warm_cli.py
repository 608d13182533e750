"""`python -m trainprof.cli ARGS` in a process of its own, forked from a Python that has
already imported torch.

Replaying a tensor trial imports torch: 1.3 of the 2 CPU-seconds such a run takes. A test
that runs the command line on tensor trials asks `run` here instead of subprocess: one server
process per test session (per xdist worker) imports torch and numpy once, and each run is a
fork of it that imports trainprof from scratch and runs `trainprof.cli` as `python -m` does
(runpy, as `__main__`, `sys.argv[0]` the module's file), in the test's working directory and
environment, with its own standard streams, memory limit, exit code and interpreter exit
(atexit, threads joined, streams flushed). An exception that escapes prints its traceback
and exits 1, as in a fresh process. What importing torch printed in the server (nothing,
today) is written first to each run's stdout and stderr.

A run whose environment differs from the server's in a variable Python reads at start-up
(PYTHON*), or off Linux, is an ordinary subprocess. The read audit (tests/read_audit.py)
sees each run's arguments as it sees a subprocess's, and the forks inherit its hook.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

SERVER = r"""
import atexit, gc, json, os, resource, sys, tempfile, threading, time

def _preload():
    # What the imports print, at the file-descriptor level, is kept for every run.
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            import numpy, torch  # noqa: F401
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        out.seek(0)
        err.seek(0)
        return out.read(), err.read()

PRINTED = _preload()
gc.freeze()  # what the forks share stays shared: the collector leaves it alone
REPLIES = os.dup(1)  # the pipe to the tests; the server's own fd 1 writes nowhere
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)

def _child(request):
    import runpy
    os.close(REPLIES)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_TRUNC),
    ):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    os.write(1, PRINTED[0])
    os.write(2, PRINTED[1])
    if request["memory"]:
        resource.setrlimit(resource.RLIMIT_AS, (request["memory"], request["memory"]))
    sys.argv = ["-m", *request["args"]]
    try:
        runpy.run_module("trainprof.cli", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:  # as the interpreter reads it
        code = e.code if e.code is None or isinstance(e.code, int) else 1
        if not (e.code is None or isinstance(e.code, int)):
            print(e.code, file=sys.stderr)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    # The interpreter's exit up to tearing the modules down (which, with torch loaded,
    # takes half a CPU-second): threads joined, atexit, the streams flushed.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code or 0)

for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        _child(request)  # never returns
    deadline = started + request["timeout"]
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() > deadline:
            os.kill(pid, 9)
            done, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.01)
    reply = {
        "returncode": os.waitstatus_to_exitcode(status),
        "seconds": time.perf_counter() - started,
        "maxrss_kb": usage.ru_maxrss,
    }
    os.write(REPLIES, (json.dumps(reply) + "\n").encode())
"""


@dataclass
class Run:
    args: list[str]
    returncode: int  # -9 when killed at the timeout
    stdout: str
    stderr: str
    seconds: float
    maxrss_kb: int


class _Server:
    def __init__(self) -> None:
        self.log = tempfile.NamedTemporaryFile(prefix="warm-cli-", suffix=".log", delete=False)
        self.env = dict(os.environ)
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def starts_like(self, env: dict[str, str]) -> bool:
        """Whether a fresh interpreter in `env` would start as the server did."""
        keys = {k for k in (*env, *self.env) if k.startswith("PYTHON")}
        return all(env.get(k) == self.env.get(k) for k in keys)

    def run(self, request: dict, timeout: float) -> dict:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout + 60)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.close()
            with open(self.log.name, encoding="utf-8", errors="replace") as f:
                raise RuntimeError(f"the warm trainprof.cli server failed:\n{f.read()[-3000:]}")
        return json.loads(line)

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        os.unlink(self.log.name)


_server: _Server | None = None


def _the_server() -> _Server:
    global _server
    if _server is None or not _server.alive():
        _server = _Server()
        atexit.register(_server.close)
    return _server


def run(*args: object, timeout: float = 300, memory: int | None = None, fresh=False) -> Run:
    """`python -m trainprof.cli ARGS`: exit code, stdout, stderr, seconds and peak RSS;
    `memory` limits the run's address space (bytes); `fresh`: an ordinary subprocess."""
    argv = [sys.executable, "-m", "trainprof.cli", *map(str, args)]
    env, cwd = dict(os.environ), os.getcwd()
    if fresh or sys.platform != "linux" or not _the_server().starts_like(env):
        return _fresh(argv, timeout, memory)
    sys.audit("subprocess.Popen", sys.executable, argv, cwd, None)
    with tempfile.TemporaryDirectory(prefix="warm-cli-") as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        for path in (out, err):
            open(path, "wb").close()
        request = {
            "args": argv[3:],
            "cwd": cwd,
            "env": env,
            "stdout": out,
            "stderr": err,
            "memory": memory,
            "timeout": timeout,
        }
        reply = _the_server().run(request, timeout)
        with open(out, "rb") as f, open(err, "rb") as g:
            stdout, stderr = f.read(), g.read()
    return Run(
        argv[3:],
        reply["returncode"],
        stdout.decode("utf-8", "replace"),
        stderr.decode("utf-8", "replace"),
        reply["seconds"],
        reply["maxrss_kb"],
    )


def _fresh(argv: list[str], timeout: float, memory: int | None) -> Run:
    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(argv, stdout=out, stderr=err, preexec_fn=limit if memory else None)
        deadline = started + timeout
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                child.kill()
                pid, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.02)
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    return Run(
        argv[3:],
        child.returncode,
        stdout.decode("utf-8", "replace"),
        stderr.decode("utf-8", "replace"),
        time.perf_counter() - started,
        usage.ru_maxrss,
    )

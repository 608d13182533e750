"""Stopping a training process on this machine: a signal to the PID in a PID file, or to
that process's whole group (torchrun and its workers).

The PID file is named in the receiver's configuration for each training job; an alert's
labels only choose which configured entry applies, so no label value ever becomes a path, an
argument or a command. Nothing here runs a shell.
"""

from __future__ import annotations

import dataclasses
import os
import signal

SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT, "SIGKILL": signal.SIGKILL}
_MAX_PID_FILE = 64


@dataclasses.dataclass(frozen=True)
class LocalJob:
    pid_file: str
    process_group: bool = False


@dataclasses.dataclass(frozen=True)
class Outcome:
    result: str  # stopped | gone | failed
    detail: str


def read_pid(path: str) -> int:
    """The PID in `path`; ValueError says what is wrong with the file."""
    # O_NOFOLLOW: a PID file replaced by a symlink is someone else's file.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        raw = f.read(_MAX_PID_FILE + 1)
    text = raw.decode("ascii", "replace").strip()
    if len(raw) > _MAX_PID_FILE or not text.isdigit():
        raise ValueError(f"{path} does not hold a process id")
    pid = int(text)
    if pid <= 1:
        raise ValueError(f"{path} holds {pid}, which is not a training process")
    return pid


def stop(job: LocalJob, signal_name: str = "SIGTERM") -> Outcome:
    sig = SIGNALS[signal_name]
    try:
        pid = read_pid(job.pid_file)
    except FileNotFoundError:
        return Outcome("gone", f"no PID file {job.pid_file}: the job is not running")
    except (OSError, ValueError) as e:
        return Outcome("failed", f"cannot read {job.pid_file}: {getattr(e, 'strerror', None) or e}")
    try:
        if job.process_group:
            group = os.getpgid(pid)
            if group <= 1:
                return Outcome(
                    "failed", f"process {pid} is in process group {group}; refusing to signal it"
                )
            if group == os.getpgrp():
                return Outcome(
                    "failed",
                    f"process {pid} is in this receiver's own process group; refusing to signal it",
                )
            os.killpg(group, sig)
            return Outcome(
                "stopped",
                f"sent {signal_name} to process group {group} (PID {pid} from {job.pid_file})",
            )
        if pid == os.getpid():
            return Outcome("failed", f"{job.pid_file} names this receiver; refusing")
        os.kill(pid, sig)
        return Outcome("stopped", f"sent {signal_name} to PID {pid} (from {job.pid_file})")
    except ProcessLookupError:
        return Outcome("gone", f"process {pid} from {job.pid_file} is not running")
    except PermissionError:
        return Outcome("failed", f"not permitted to signal process {pid}")

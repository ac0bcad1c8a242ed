"""What killed jobs leave in a node's /tmp, removed by the next job's processes there (side effects only).

A warm server writes `<prefix>.<node>.pid` and an aggregator binds
`clusterctl-<attempt>-<node>.sock` in TMPDIR (else /tmp), and each removes
its own when it ends. A job that is killed (scancel of a hung step,
SIGKILL at the end of KillWait, a node reboot's lost processes) leaves them
behind, and a node that runs many jobs gathers thousands. So each warm
server and aggregator, as it starts, removes this user's leftovers of the
same kind: a pid file whose process is gone, a socket nobody listens on.
Only this user's own regular files and sockets are touched, never through a
link; another user's are theirs. The running job's own pid files stay, dead
or not: a rank refused by its node's server tells "ended" from "not yet
listening" by that file (runtime/node/warm/client.py), and another node's
server or aggregator starting later must not take that answer away.
"""

from __future__ import annotations

import fnmatch
import os
import socket
import stat
import time
from pathlib import Path

PID_FILES = "clusterctl-warm.*.pid"
EMPTY_GRACE_S = 60.0  # an empty pid file younger than this may be one a server is about to write
SOCKETS = "clusterctl-*-*.sock"


def _mine(path: str, kind: int) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_IFMT(info.st_mode) == kind and info.st_uid == os.geteuid()


def _pid_gone(path: str, now: float) -> bool:
    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read().strip()
        pid = int(text or "0")
    except (OSError, ValueError, UnicodeDecodeError):
        return True  # not a pid file of ours
    if pid <= 0:  # empty: a server between creating it and writing its pid, unless that was long ago
        try:
            return now - os.lstat(path).st_mtime > EMPTY_GRACE_S
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # a process of someone else's has that pid now: leave it be
    return False


def _nobody_listens(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return False


def sweep(directory: str | Path, keep: str = "", job: str = "") -> int:
    """Remove this user's dead pid files and sockets in `directory` (but not `keep`, the caller's own, nor the pid
    files of `job`, the running job's warm prefix); how many."""
    removed, now = 0, time.time()
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    for name in names:
        path = os.path.join(directory, name)
        if path == keep:
            continue
        if fnmatch.fnmatch(name, PID_FILES):
            if job and name.startswith(f"{job}."):
                continue
            dead = _mine(path, stat.S_IFREG) and _pid_gone(path, now)
        elif fnmatch.fnmatch(name, SOCKETS):
            dead = _mine(path, stat.S_IFSOCK) and _nobody_listens(path)
        else:
            continue
        if dead:
            try:
                os.unlink(path)
                removed += 1
            except OSError:
                pass
    return removed


def tmpdir() -> str:
    return os.environ.get("TMPDIR") or "/tmp"

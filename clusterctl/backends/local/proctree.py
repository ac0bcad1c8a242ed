"""A job's processes: everything descended from its supervisor.

Slurm tracks a job's processes in a container (cgroup or proctrack) so that
nothing outlives the job. Here the supervisor makes itself a child subreaper
(prctl PR_SET_CHILD_SUBREAPER), so processes that daemonise or lose their
parent are re-parented to it and stay in its process tree; the job's
processes are then exactly the supervisor's descendants — except another
job's supervisor (a continuation job submitted from inside this one), which
is left alone with its whole tree.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable

PR_SET_CHILD_SUBREAPER = 36
SUPERVISOR_MARK = b"clusterctl.backends.local.supervisor"
GIVE_UP_S = 10.0


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux >= 3.4); False where that is not possible."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, int]:
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2:].split()
        out[int(name)] = int(fields[1])
    return out


def _is_supervisor(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return SUPERVISOR_MARK in fh.read()
    except OSError:
        return False


def descendants(root: int) -> list[int]:
    """Every process below `root`, parents before children, other jobs' supervisors excluded."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        if _is_supervisor(pid):
            continue
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def send(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def terminate(root: int, kill_wait: float, reap: Callable[[], None], tick: float = 0.05) -> list[int]:
    """Slurm's job kill: SIGCONT and SIGTERM to every process, SIGKILL after kill_wait, until none is left.

    Returns the processes still there after a further GIVE_UP_S (stuck in the
    kernel, say), which is empty in every case but a broken machine.
    """
    pids = descendants(root)
    send(pids, signal.SIGCONT)
    send(pids, signal.SIGTERM)
    kill_at = time.monotonic() + kill_wait
    give_up = kill_at + GIVE_UP_S
    while True:
        reap()
        pids = descendants(root)
        now = time.monotonic()
        if not pids or now >= give_up:
            return pids
        if now >= kill_at:
            send(pids, signal.SIGKILL)
        time.sleep(tick)

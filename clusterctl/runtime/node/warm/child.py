"""What a child forked from the warm server does: become the process a cold start would have been, then run.

A cold rank is `python -m clusterctl.launch -- CMD` started by the wrapper
with the rank's environment, working directory, standard streams, CPU and
memory binding. The child was forked from a server that has none of those:
it takes each from the request (its streams arrive as descriptors), leaves
the server's session and signal handlers behind, dies with the server
(PR_SET_PDEATHSIG) and, once the command ends, exits as a cold rank does
(runtime/rank/procexit.py: non-daemon threads joined, atexit handlers run, files
flushed, no interpreter shutdown) without ever returning into the server's loop.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import signal
import sys
from typing import Any

from clusterctl import envnames
from clusterctl.runtime.node.warm import title
from clusterctl.runtime.rank import procexit

PR_SET_PDEATHSIG = 1
MPOL_BIND = 2
SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237, "ppc64le": 261}  # the syscall's number per architecture


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """SIGKILL when the server goes: a child must not outlive the process srun's step tracks."""
    with contextlib.suppress(OSError, AttributeError):
        _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def default_signals() -> None:
    """The handlers a fresh interpreter has (the server's own are not the rank's)."""
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM,
                signal.SIGQUIT, signal.SIGCONT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as Python sets it at start-up


def adopt_streams(fds: list[int], env: dict[str, str]) -> None:
    """The client's stdin, stdout and stderr become ours, buffered as a fresh interpreter would buffer them."""
    for target, fd in enumerate(fds):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    encoding = sys.stdout.encoding if sys.stdout is not None else "utf-8"
    errors = sys.stdout.errors if sys.stdout is not None else "strict"

    def text(fd: int, mode: str, line: bool) -> io.TextIOWrapper:
        raw = io.FileIO(fd, mode, closefd=False)
        buffered = io.BufferedWriter(raw) if mode == "w" else io.BufferedReader(raw)
        return io.TextIOWrapper(buffered, encoding=encoding, errors="backslashreplace" if fd == 2 else errors,
                                line_buffering=line, write_through=unbuffered and mode == "w")

    sys.stdin = sys.__stdin__ = text(0, "r", False)
    sys.stdout = sys.__stdout__ = text(1, "w", os.isatty(1))
    sys.stderr = sys.__stderr__ = text(2, "w", True)


def adopt_environment(request: dict[str, Any]) -> None:
    """Working directory, umask, environment, sys.path: what the rank's own `python -m` would have had."""
    env = dict(request["env"])
    os.chdir(request["cwd"])
    os.umask(int(request["umask"]))
    old_paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ.clear()
    os.environ.update(env)
    new_paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = [p for p in sys.path[1:] if p not in old_paths]
    sys.path[:] = [os.getcwd(), *new_paths, *rest]  # `python -m` puts the working directory first


def adopt_binding(request: dict[str, Any]) -> list[str]:
    """The client's CPUs (set by srun and numactl/taskset), its NUMA node's memory, its thread counts; what failed."""
    problems = []
    cpus = request.get("affinity")
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as exc:
            problems.append(f"cannot bind to CPUs {cpus}: {exc}")
    numa = os.environ.get(envnames.NUMA, "")
    if os.environ.get(envnames.BIND_TOOL) == "numactl" and numa.isdigit():
        number = SET_MEMPOLICY.get(os.uname().machine)
        mask = ctypes.c_ulong(1 << int(numa))
        if number is None or _libc().syscall(number, MPOL_BIND, ctypes.byref(mask), 8 * ctypes.sizeof(mask) + 1) != 0:
            problems.append(f"cannot bind memory to NUMA node {numa} (errno {ctypes.get_errno()})")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))  # the OpenMP runtime read the server's value when torch loaded
    return problems


def become(request: dict[str, Any], fds: list[int], started: str) -> None:
    """Run the request's command in this (forked) process; never returns."""
    def run() -> None:
        os.setsid()  # out of the server's process group: signals reach a rank through its client or its pid
        die_with_parent()
        default_signals()
        adopt_streams(fds, request["env"])
        adopt_environment(request)
        os.environ[envnames.START] = started
        title.set_names(*title.rank_names(list(request["argv"]), os.environ.get("RANK", "")))
        for problem in adopt_binding(request):
            print(f"clusterctl warm start: {problem}", file=sys.stderr)
        from clusterctl.runtime.rank.launch import run_command

        sys.argv = list(request["argv"])
        run_command(list(request["argv"]))

    procexit.end_like(run)

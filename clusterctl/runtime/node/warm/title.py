"""What `ps`, `top` and /proc/PID/comm show for a forked rank and for its stand-in.

A child forked from the warm server would otherwise show the server's
command line (`python3 -m clusterctl.runtime.node.warm.server --run-dir ...`)
while the stand-in srun started shows the script's: a user who signals
"the rank" by its name in `ps` would signal the stand-in. So the child
names its script and rank, and the stand-in says what it is and which pid
the rank has. Standard library only: this is on every rank's path.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex

PR_SET_NAME = 15
COMM_LEN = 15  # /proc/PID/comm: 16 bytes with the NUL
INTERPRETERS = ("python", "python3", "pypy3")


def command(argv: list[str]) -> list[str]:
    """The user's command inside ours: what follows the first `--` (`clusterctl.launch -- CMD`), else argv."""
    return argv[argv.index("--") + 1 :] if "--" in argv else list(argv)


def program(cmd: list[str]) -> str:
    """The name a user knows the process by: the script or module an interpreter runs, else the executable."""
    args = list(cmd)
    if args and os.path.basename(args[0]).startswith(INTERPRETERS):
        args = args[1:]
        if len(args) >= 2 and args[0] == "-m":
            return args[1]
        args = [a for a in args if not a.startswith("-")]
    return os.path.basename(args[0]) if args else "python"


def rank_names(argv: list[str], rank: str) -> tuple[str, str]:
    """(title, comm) of a forked process: `clusterctl rank 3: python3 train.py ...`, `train.py:3`."""
    cmd = command(argv)
    if not rank:
        return f"clusterctl: {shlex.join(cmd)}", program(cmd)[:COMM_LEN]
    tag = f":{rank}"
    return f"clusterctl rank {rank}: {shlex.join(cmd)}", program(cmd)[: COMM_LEN - len(tag)] + tag


def stand_in_names(argv: list[str], rank: str, pid: int, host: str) -> tuple[str, str]:
    """(title, comm) of the stand-in: it names the rank's pid, the process to signal."""
    who = f"rank {rank}" if rank else "a forked process"
    return (f"clusterctl stand-in for {who} (the rank is pid {pid} on {host}): {shlex.join(command(argv))}",
            f"stand-in:{rank}" if rank else "stand-in")


def set_names(title: str, comm: str) -> None:
    """This process's command line becomes `title` (cut to the room its own had) and its comm `comm`.

    The command line is the memory the kernel reads /proc/PID/cmdline from
    (stat's arg_start..arg_end): CPython keeps its own copies of argv, so
    the bytes are rewritten in place, NUL-padded. Where any of it fails the
    names stay as they were: they are for people, nothing reads them.
    """
    with contextlib.suppress(OSError, AttributeError, ValueError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(comm.encode()[:COMM_LEN]), 0, 0, 0)
        with open("/proc/self/stat", "rb") as fh:
            text = fh.read().decode(errors="replace")
        fields = text[text.rfind(")") + 2 :].split()
        start, end = int(fields[45]), int(fields[46])  # stat(5) fields 48 and 49, arg_start and arg_end
        room = end - start
        if start <= 0 or room < 2:
            return
        data = title.encode(errors="replace")[: room - 1]
        ctypes.memmove(start, data + b"\0" * (room - len(data)), room)

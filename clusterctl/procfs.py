"""Processes as the kernel reports them, for the node side and the local backend alike: a state from /proc (the aggregator's view of its ranks, the fault
injector), how another's process ended (the warm client, of its forked rank), the children that have ended
(the warm process server, the local backend's supervisor)."""

from __future__ import annotations

import os
from collections.abc import Iterator


def process_state(pid: int) -> str:
    """The one-letter state from /proc/PID/stat (R, S, D, T, t, Z, ...), '' when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return text[text.rfind(")") + 2 :].split(" ", 1)[0]


def zombie_status(pid: int) -> int | None:
    """The wait status of a process that has ended and not yet been reaped (/proc/PID/stat's exit_code
    field, Linux 3.5+): how a process other than our child ended. None while it runs, or once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode(errors="replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()
    if not fields or fields[0] != "Z" or len(fields) < 50:
        return None
    try:
        return int(fields[49])  # field 52 of stat(5); fields here start at field 3
    except ValueError:
        return None


def exited_children() -> Iterator[tuple[int, int]]:
    """(pid, wait status) of every child that has ended, without blocking; none left to wait for ends it."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, status

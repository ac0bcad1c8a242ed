"""The heartbeat path's messages: one definition for the rank, the aggregator, the watch server and the watchdog.

Rank to its node's aggregator, one JSON datagram on a Unix socket named
from the attempt and the node (`socket_path`), built by `rank_message`:

    {kind, rank, attempt, step, phase, step_s, compute_s, t, pid, gpu}

where kind is HELLO (first), PHASE (a phase change), STEP (a step done,
with its wall and compute time), ALIVE (each second) or CLOSED (the loop is
done). A SIGSTOPped or dead process stops all of them; a rank blocked in a
collective keeps its ALIVE beat but stops changing phase, which is how the
watchdog tells a hang's culprit from its victims.

Aggregator to the controller, one JSON line each on the watch connection
after the greeting (wire/greeting.py):

    BATCH {node, t, beats, procs}  the ranks' messages as they came, the latest ALIVE per rank and GPU samples
                                   ({kind: GPU, node, t, gpus}); procs maps each rank to a PROCESS_STATES entry
                                   (GONE's name doubles as the state of a process that ended)
    GONE  {node, rank, pid, t}     a rank's process ended (sent at once)
    BYE   {node}                   the aggregator is done: its connection closing is not a lost node

Controller to the aggregators: {cmd: DUMP} (every rank writes its stacks)
or {cmd: KILL} (every rank of the node is killed).

These kinds are the wire's; the timeline's record kinds (rundir/timeline.py)
are the controller's file format, mapped from these where it writes them.
Standard library only: the rank imports this before the user's script.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

HELLO, PHASE, STEP, ALIVE, CLOSED = "hello", "phase", "step", "alive", "closed"
RANK_KINDS = (HELLO, PHASE, STEP, ALIVE, CLOSED)
PROGRESS_KINDS = (PHASE, STEP)  # what moves a rank on; HELLO and ALIVE only say it lives
PHASES = ("start", "load", "forward", "backward", "optimizer", "collective", "save", "eval", "idle")

BATCH, GONE, BYE, GPU = "batch", "gone", "bye", "gpu"
PROCESS_STATES = ("running", "sleeping", "stopped", "gone")
DUMP, KILL = "dump", "kill"

MAX_DATAGRAM = 65536


def socket_path(directory: str, token: str, node: str) -> str:
    """The node aggregator's socket: one per attempt (token) and emulated node, short enough for AF_UNIX."""
    name = node if len(node) <= 40 and "/" not in node else hashlib.sha1(node.encode()).hexdigest()[:16]
    attempt = hashlib.sha256(token.encode()).hexdigest()[:12]  # names the attempt without giving away its token
    return os.path.join(directory, f"clusterctl-{attempt}-{name}.sock")


def rank_message(kind: str, rank: int, attempt: int, step: int, phase: str, step_s: float | None,
                 compute_s: float | None, t: float, pid: int, gpu: int | None) -> dict[str, Any]:
    """A rank's datagram (module doc)."""
    return {"kind": kind, "rank": rank, "attempt": attempt, "step": step, "phase": phase, "step_s": step_s,
            "compute_s": compute_s, "t": t, "pid": pid, "gpu": gpu}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_rank_message(data: bytes) -> dict[str, Any] | None:
    """A rank's datagram as the aggregator passes it on, or None for anything else.

    The socket is the job owner's (0700), so a malformed datagram is a bug of
    theirs (a script that reuses the socket, a torn send): dropped, never a
    crash and never a record the watchdog would judge from.
    """
    try:
        msg = json.loads(data)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    if not isinstance(msg, dict) or msg.get("kind") not in RANK_KINDS:
        return None
    rank, pid = msg.get("rank"), msg.get("pid") or 0
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
        return None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
        return None
    if not isinstance(msg.get("step", 0), int) or msg.get("phase", PHASES[0]) not in PHASES:
        return None
    if any(msg.get(field) is not None and not _number(msg[field]) for field in ("step_s", "compute_s", "t")):
        return None
    return msg


def command(line: bytes) -> str | None:
    """The controller's command on an aggregator's connection (DUMP or KILL), or None."""
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None
    cmd = msg.get("cmd") if isinstance(msg, dict) else None
    return cmd if cmd in (DUMP, KILL) else None


def command_line(cmd: str) -> bytes:
    """What the controller sends an aggregator for `cmd`."""
    if cmd not in (DUMP, KILL):
        raise ValueError(f"unknown aggregator command {cmd!r}; expected {DUMP} or {KILL}")
    return (json.dumps({"cmd": cmd}) + "\n").encode()

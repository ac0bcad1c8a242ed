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

    BATCH {node, t, ranks, procs, gpus?}  one row per rank heard from since the last batch (ROW, made by
                                   RankDigest); procs maps each rank whose process state changed since the
                                   last batch (every rank in the first) to a PROCESS_STATES entry (GONE's
                                   name doubles as the state of a process that ended); gpus: the node's
                                   latest GPU sample, when one was taken since
    GONE  {node, rank, pid, t}     a rank's process ended (sent at once)
    BYE   {node}                   the aggregator is done: its connection closing is not a lost node

A row says in one list what the rank's messages of the interval said one by
one: 5 messages a rank a second at 1 s steps (three phases, a step, a beat)
were 0.9 KB of JSON each second and as many dicts for the controller, which
cannot hold 100,000 ranks' worth in one process; a row is one list. What
the watchdog judges is kept exactly: the last phase and step, whether the
rank moved on, its step count, and every phase change and step up to the
welcome's `cap` a batch (the controller's budget over the world: no cap a
small job reaches). Past it, steps are kept every `stride`-th, a power of
two, so that nodes at the same pace keep the same steps and the straggler
rule still finds steps every rank reported; changes of phase past it are
dropped but those into and out of save, load and eval, which the watchdog
times.

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

BATCH, GONE, BYE = "batch", "gone", "bye"
PROCESS_STATES = ("running", "sleeping", "stopped", "gone")
DUMP, KILL = "dump", "kill"

MAX_DATAGRAM = 65536

ROW = ("rank", "pid", "gpu", "phase", "step", "sent", "moved", "closed", "done", "changes", "steps")
# changes: [[phase, step, at], ...], the phase changes in order; steps: [[step, phase, at, step_s, compute_s], ...]
TIMED_PHASES = ("save", "load", "eval")  # changes into and out of these are kept past the cap: the watchdog times them
EVENT_BUDGET = 1 << 20  # phase changes and steps a second the controller takes from the whole world (welcome_cap)
MIN_CAP = 8


def welcome_cap(world: int) -> int:
    """How many phase changes and steps of each rank a batch may carry: the budget shared by the world, at least
    MIN_CAP (262,144 at 4 ranks, 64 at 16,384, 10 at 100,000)."""
    return max(MIN_CAP, EVENT_BUDGET // max(1, world))


class RankDigest:
    """One rank's messages since the last batch, as the row the aggregator sends (and the watchdog applies).

    It keeps what the watchdog needs across batches: the phase and step of
    the rank's last progress and the send time of its latest news, for the
    rule that a liveness beat showing another phase or step than the last
    progress (and newer than it) carries a phase message lost on the way.
    """

    def __init__(self, rank: int, cap: int = EVENT_BUDGET, detail: bool = True) -> None:
        """`detail`: every phase change (up to cap); else only those into and out of TIMED_PHASES (the timeline
        records this node's ranks in detail or not at all: watchserver.detail_nodes)."""
        self.rank = rank
        self.cap = cap
        self.detail = detail
        self._said: tuple[int | None, int | None] = (None, None)  # the pid and GPU the last row carried
        self.phase, self.step, self.sent = PHASES[0], -1, 0.0
        self.progressed = False  # any progress ever: before it, a beat's phase is no news
        self.pid: int | None = None
        self.gpu: int | None = None
        self.stride = 1  # steps kept: every stride-th, once a batch would hold more than cap
        self._clear()

    def _clear(self) -> None:
        self.heard = self.moved = self.closed = False
        self.done = 0
        self.changes: list[list[Any]] = []
        self.steps: list[list[Any]] = []

    def take(self, msg: dict[str, Any]) -> None:
        """A rank message (parse_rank_message's)."""
        self.heard = True
        if msg.get("pid"):
            self.pid = int(msg["pid"])
        if msg.get("gpu") is not None:
            self.gpu = msg["gpu"]
        kind = msg.get("kind")
        if kind == CLOSED:
            self.closed = True
        step = int(msg.get("step", self.step))
        phase = str(msg.get("phase", self.phase))
        sent = float(msg.get("t") or 0.0)
        if kind == ALIVE and self.progressed and (phase, step) != (self.phase, self.step) and sent > self.sent:
            kind = PHASE  # a phase message was lost on the way (datagrams): the liveness beat carries the news
        if kind not in PROGRESS_KINDS:
            return
        self.sent = max(self.sent, sent)
        if kind == STEP:
            self.done += 1
            if step % self.stride == 0 and len(self.steps) < self.cap:
                self.steps.append([step, phase, sent, msg.get("step_s"), msg.get("compute_s")])
        if kind == STEP or phase != self.phase or step != self.step:
            self.moved = self.progressed = True
        if phase != self.phase and ((self.detail and len(self.changes) < self.cap)
                                    or phase in TIMED_PHASES or self.phase in TIMED_PHASES):
            self.changes.append([phase, step, sent])
        self.phase, self.step = phase, step

    def row(self) -> list[Any] | None:
        """The batch's row for this rank (ROW), or None when it said nothing since the last; starts the next."""
        if not self.heard:
            return None
        same = (self.pid, self.gpu) == self._said  # said once, then only when they change
        self._said = (self.pid, self.gpu)
        row = [self.rank, None if same else self.pid, None if same else self.gpu, self.phase, self.step, self.sent,
               self.moved, self.closed, self.done, self.changes, self.steps]
        self.stride = 1  # the next batch keeps every stride-th step: at this one's pace, at most cap of them
        while self.done > self.cap * self.stride:
            self.stride *= 2
        self._clear()
        return row


def batch(node: str, t: float, rows: list[list[Any]], procs: dict[str, str], gpus: dict[str, Any] | None = None) -> dict[str, Any]:
    """An aggregator's BATCH (module doc)."""
    msg: dict[str, Any] = {"kind": BATCH, "node": node, "t": t, "ranks": rows, "procs": procs}
    if gpus is not None:
        msg["gpus"] = gpus
    return msg


def rows_of(messages: list[dict[str, Any]], cap: int = EVENT_BUDGET) -> list[list[Any]]:
    """The rows of a batch that carried these rank messages, each rank's digested in order (for stand-ins and
    tests: the aggregator keeps its digests across batches)."""
    digests: dict[int, RankDigest] = {}
    for msg in messages:
        digests.setdefault(msg["rank"], RankDigest(msg["rank"], cap)).take(msg)
    return [row for row in (d.row() for d in digests.values()) if row is not None]


def parse_row(row: Any) -> tuple[Any, ...] | None:
    """A batch row as the watch server applies it, or None for one that is not a row (a greeted aggregator's
    bug, never a crash).

    Every second at 100,000 ranks runs this 100,000 times on one thread, hence exact type tests and plain loops
    (a JSON value's type is exact: a bool is no count and no rank); generator-based checks made it 40% of the
    watch server's time."""
    if type(row) is not list or len(row) != _ROW_LEN:
        return None
    rank, pid, gpu, phase, step, sent, moved, closed, done, changes, steps = row
    if not (type(rank) is int and rank >= 0 and type(step) is int and type(done) is int and type(phase) is str
            and phase in _PHASE_SET and type(sent) in _NUMBERS and type(changes) is list and type(steps) is list):
        return None
    for c in changes:
        if type(c) is not list or len(c) != 3 or type(c[0]) is not str or c[0] not in _PHASE_SET \
                or type(c[1]) is not int:
            return None
    for s in steps:
        if type(s) is not list or len(s) != 5 or type(s[0]) is not int or type(s[1]) is not str \
                or s[1] not in _PHASE_SET:
            return None
        wall, compute = s[3], s[4]
        if (wall is not None and type(wall) not in _NUMBERS) or (compute is not None and type(compute) not in _NUMBERS):
            return None
    return rank, pid if type(pid) is int else None, gpu, phase, step, float(sent), bool(moved), bool(closed), \
        done, changes, steps


_ROW_LEN = len(ROW)
_PHASE_SET = frozenset(PHASES)
_NUMBERS = frozenset((int, float))  # what JSON's numbers decode to (bool apart)


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

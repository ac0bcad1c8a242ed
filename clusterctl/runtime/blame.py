"""Who ended the attempt: culprits apart from victims, once the ranks are gone.

Pure: it reads the facts the controller gathered — srun's own task lines
(`srun: error: n2: task 2: Killed`), each rank's reported error, when the
node aggregators saw each rank's process end, which aggregators vanished —
and returns a verdict. The rule (also in docs/design/watchdog.md):

1. A node whose aggregator vanished without saying goodbye while its ranks
   ran, and whose ranks are gone too, is a lost node (86): its ranks are the
   culprits.
2. Otherwise the culprits are the ranks that ended on their own (84): killed
   by a signal or exiting non-zero before srun began terminating the step,
   or reporting an error of their own (a traceback that is not a peer's
   failure seen from here). The one that ended first is the primary culprit.
3. Every other rank that failed is a victim: it reported a peer's failure
   (connection closed or reset by peer, a collective aborted or timed out),
   or srun terminated it after the culprit ended. The last rank to time out
   or the first to notice is never the cause.
"""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass, field
from typing import Any

from clusterctl.exitcodes import ExitCode
from clusterctl.rundir.verdict import Verdict
from clusterctl.syntax.cpulist import parse_cpulist

# srun: error: n2: task 2: Killed | srun: error: n1: tasks 0-1: Exited with exit code 1
_TASK_LINE = re.compile(r"srun: error: (?P<node>\S+): tasks? (?P<ranks>[0-9,\-]+): (?P<what>.+?)\s*$")
_TERMINATING = re.compile(r"_step_signal: Terminating|Job step aborted|forcing job termination|Force Terminated")
_EXIT_CODE = re.compile(r"Exited with exit code (\d+)")
# What a rank says when a peer failed under it: never a cause of its own.
PEER_FAILURE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|ECONNRESET|EPIPE"
    r"|NCCL communicator was aborted|ProcessGroupNCCL.*(timed out|Watchdog)|Socket Timeout|timed out|Timeout"
    r"|remote process exited|peer.*(closed|died|exited)|ncclRemoteError|Application timeout caused pair closure"
    r"|DistNetworkError|DistStoreError",
    re.I,
)
# Codes a rank exits with on purpose (a verdict of ours, or a requested stop): not a failure of its own.
OUR_CODES = {int(c) for c in ExitCode if 80 <= c <= 87}


@dataclass(frozen=True)
class TaskEnd:
    """One srun task line: these ranks on this node ended this way."""

    node: str
    ranks: tuple[int, ...]
    what: str  # Killed, Terminated, Exited with exit code 1, Segmentation fault, ...
    after_terminate: bool  # srun had already begun terminating the step

    @property
    def signalled(self) -> bool:
        return not self.what.startswith("Exited")

    @property
    def exit_code(self) -> int | None:
        found = _EXIT_CODE.search(self.what)
        return int(found.group(1)) if found else None


def stopped_on_request(ends: list[TaskEnd]) -> bool:
    """A rank exited with 85: the ranks saved and committed on request. srun's --kill-on-bad-exit
    then stops the ones still on their way out; they are not failures."""
    return any(e.exit_code == int(ExitCode.PRE_TIMEOUT) for e in ends)


def parse_srun_lines(lines: list[str]) -> list[TaskEnd]:
    """srun's task lines in the order srun printed them, each marked before or after its terminate."""
    ends: list[TaskEnd] = []
    terminating = False
    for line in lines:
        found = _TASK_LINE.search(line)
        if found:
            try:
                ranks = tuple(sorted(parse_cpulist(found.group("ranks"))))
            except ValueError:
                continue
            ends.append(TaskEnd(found.group("node"), ranks, found.group("what"), terminating))
        elif _TERMINATING.search(line):
            terminating = True
    return ends


_NODE_FAILURE = re.compile(r"srun: error: Node failure on (?P<node>\S+)")


def node_failures(lines: list[str]) -> set[str]:
    """Nodes srun says failed (Slurm declared them down while the step ran on them)."""
    return {m.group("node") for line in lines if (m := _NODE_FAILURE.search(line))}


@dataclass
class Facts:
    world: int
    hosts: list[str]
    gpus_per_node: int
    gpus: dict[int, Any] = field(default_factory=dict)  # rank -> physical GPU index
    errors: dict[int, str] = field(default_factory=dict)  # rank -> the error it reported
    srun: list[TaskEnd] = field(default_factory=list)
    deaths: dict[int, float] = field(default_factory=dict)  # rank -> when its process was seen gone
    lost_nodes: dict[str, float] = field(default_factory=dict)  # node -> when its aggregator vanished
    failed_nodes: set[str] = field(default_factory=set)  # srun: "Node failure on NODE" (Slurm declared it down)

    def host(self, rank: int) -> str:
        slot = rank // self.gpus_per_node
        return self.hosts[slot] if slot < len(self.hosts) else "?"

    def entry(self, rank: int, reason: str) -> dict[str, Any]:
        return {"rank": rank, "host": self.host(rank), "gpu": self.gpus.get(rank), "reason": reason}


def _as_signal(code: int | None) -> str:
    """128 + N is how a shell or a container runtime (Apptainer, bwrap) reports a process that signal N ended."""
    if not code or code <= 128:
        return ""
    try:
        return f" (128 + {signal.Signals(code - 128).name}: a signal, as a shell or container reports it)"
    except ValueError:
        return ""


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    # A traceback's last line names the exception; a plain message is its own first line.
    return (lines[-1] if lines and lines[0].startswith("Traceback") else lines[0] if lines else "")[:300]


def blame_end(facts: Facts) -> Verdict | None:
    """The verdict of an attempt whose ranks failed; None when no rank failed."""
    ended_by: dict[int, TaskEnd] = {}
    for end in facts.srun:
        for rank in end.ranks:
            ended_by.setdefault(rank, end)
    failed = set(facts.errors) | {r for r, e in ended_by.items() if e.signalled or _failing_code(e.exit_code)}
    if not failed and not facts.lost_nodes:
        return None

    lost = _lost_node(facts, ended_by)
    if lost is not None:
        return lost

    def own_failure(rank: int) -> str | None:
        """Why this rank failed on its own, or None when it is a peer's failure seen from here."""
        error = facts.errors.get(rank)
        if error is not None and not PEER_FAILURE.search(error):
            return f"script failed: {_first_line(error)}"
        end = ended_by.get(rank)
        if end is None or end.after_terminate or error is not None:
            return None
        if end.signalled:
            return f"killed by a signal ({end.what}) before any peer failed"
        if _failing_code(end.exit_code):
            return f"exited with code {end.exit_code}{_as_signal(end.exit_code)} on its own"
        return None

    culprits = {r: why for r in sorted(failed) if (why := own_failure(r)) is not None}
    if not culprits and failed:
        # Every failure looks like a reaction: blame whoever failed first.
        first = min(failed, key=lambda r: (facts.deaths.get(r, float("inf")), r))
        culprits = {first: "failed first; every failure reported looks like a reaction to a peer"}
    order = sorted(culprits, key=lambda r: (facts.deaths.get(r, float("inf")), _srun_position(facts, r), r))
    victims = [
        facts.entry(r, _victim_reason(facts, r, ended_by.get(r)))
        for r in range(facts.world)
        if r not in culprits and (r in failed or r in ended_by)
    ]
    primary = order[0]
    evidence: dict[str, Any] = {
        "srun": [f"{e.node}: task(s) {','.join(map(str, e.ranks))}: {e.what}" for e in facts.srun],
    }
    end = ended_by.get(primary)
    if end is not None:
        evidence["how"] = end.what
    if primary in facts.errors:
        evidence["traceback"] = facts.errors[primary]
    if primary in facts.deaths:
        evidence["died_at"] = facts.deaths[primary]
    more = f" (+{len(order) - 1} more)" if len(order) > 1 else ""
    return Verdict(
        False,
        int(ExitCode.SCRIPT_FAILED),
        f"rank {primary} on {facts.host(primary)} failed: {culprits[primary]}{more};"
        f" {len(victims)} rank(s) stopped because of it",
        [facts.entry(r, culprits[r]) for r in order],
        evidence,
        victims,
    )


def _lost_node(facts: Facts, ended_by: dict[int, TaskEnd]) -> Verdict | None:
    """The first node whose aggregator vanished and whose ranks went with it: all seen gone, or none
    seen at all (a node that dies takes its observer along; srun may only say "Node failure")."""
    for node, when in sorted(facts.lost_nodes.items(), key=lambda item: item[1]):
        ranks = [r for r in range(facts.world) if facts.host(r) == node]
        if not ranks:
            continue
        seen = [r for r in ranks if r in ended_by or r in facts.deaths]
        # Unseen ranks on the first node to vanish went with it, unless a rank elsewhere was killed
        # before srun began terminating: that rank failed on its own, and only an aggregator went.
        killed_elsewhere = any(e.signalled and not e.after_terminate and e.node != node for e in facts.srun)
        silent = not seen and not killed_elsewhere and node == min(facts.lost_nodes, key=facts.lost_nodes.__getitem__)
        if len(seen) < len(ranks) and not silent and node not in facts.failed_nodes:
            continue  # its aggregator went, but its ranks did not: not a lost node
        return lost_node_verdict(facts, node, when, ended_by)
    return None


def lost_node_verdict(facts: Facts, node: str, when: float, ended_by: dict[int, TaskEnd] | None = None) -> Verdict:
    """Node `node` is lost: its ranks are the culprits, every other rank that stopped is a victim."""
    ended_by = ended_by or {}
    ranks = [r for r in range(facts.world) if facts.host(r) == node]
    victims = [
        facts.entry(r, _victim_reason(facts, r, ended_by.get(r)))
        for r in range(facts.world)
        if r not in ranks and (r in facts.errors or r in ended_by or not ended_by)
    ]
    return Verdict(
        False,
        int(ExitCode.NODE_LOST),
        f"node {node} lost: its aggregator and all its {len(ranks)} rank(s) ({ranks[0]}..{ranks[-1]}) vanished at"
        f" once; {len(victims)} rank(s) elsewhere stopped because of it",
        [facts.entry(r, f"node {node} lost") for r in ranks],
        {
            "node": node,
            "aggregator_lost_at": when,
            "srun": [f"{e.node}: task(s) {','.join(map(str, e.ranks))}: {e.what}" for e in facts.srun],
        },
        victims,
    )


def _failing_code(code: int | None) -> bool:
    return bool(code) and code not in OUR_CODES


def _srun_position(facts: Facts, rank: int) -> int:
    for i, end in enumerate(facts.srun):
        if rank in end.ranks:
            return i
    return len(facts.srun)


def _victim_reason(facts: Facts, rank: int, end: TaskEnd | None) -> str:
    error = facts.errors.get(rank)
    if error is not None:
        return f"peer failure seen here: {_first_line(error)}"
    if end is not None:
        return f"stopped by srun after the culprit ended ({end.what})"
    return "stopped after the culprit ended"

"""Who ended the attempt, and whose fault it is: culprits apart from victims, once the ranks are gone.

Pure: it reads the facts the controller gathered — srun's own task lines
(`srun: error: n2: task 2: Killed`), each rank's reported error, which ranks
reported that their command returned, how many steps each finished, when
the node aggregators saw each rank's process end, which aggregators
vanished — and returns a verdict. The rule (docs/guide/verdicts.md, "Who is
at fault"; the error patterns are runtime/controller/errorpatterns.py):

1. Every rank's command returned: the attempt completed, whatever srun said
   of the processes' ends afterwards. A rank that returned is never a culprit.
2. A node whose aggregator vanished without saying goodbye while its ranks
   ran, and whose ranks are gone too, is a lost node (86).
3. Node evidence comes next, whatever the other ranks raised: a hardware or
   fabric error in a rank's report, or a rank killed from outside by a
   signal before srun began terminating the step (84, fault `node`). A
   kill that hit ranks of every node at once is not one node's (ambiguous).
4. Otherwise the culprits are the ranks that failed on their own, and the
   victims are those that reported a peer's failure or that srun stopped
   after a culprit ended. The culprits' errors decide the fault:
   * a Python error that stops a script before its first step (syntax,
     imports, a missing file, argparse's exit 2), or the same exception
     (errorpatterns.signature) on every rank that failed on its own when
     those cover every rank or ranks of every node: the script's (88); no
     node is blamed and the run stops;
   * the same file-system or store error on every node: shared
     infrastructure (84, `infrastructure`): one restart, no blame;
   * anything else (one rank's exception, a code or a signal of its own on
     some nodes only, failures that all look like reactions): ambiguous (84).
"""

from __future__ import annotations

import re
import signal
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from clusterctl.exitcodes import ExitCode
from clusterctl.rundir.verdict import FAULT_AMBIGUOUS, FAULT_INFRASTRUCTURE, FAULT_NODE, FAULT_SCRIPT, Verdict
from clusterctl.runtime.controller import errorpatterns
from clusterctl.syntax.cpulist import parse_cpulist

# srun: error: n2: task 2: Killed | srun: error: n1: tasks 0-1: Exited with exit code 1
_TASK_LINE = re.compile(r"srun: error: (?P<node>\S+): tasks? (?P<ranks>[0-9,\-]+): (?P<what>.+?)\s*$")
_TERMINATING = re.compile(r"_step_signal: Terminating|Job step aborted|forcing job termination|Force Terminated")
_EXIT_CODE = re.compile(r"Exited with exit code (\d+)")
OOM = re.compile(r"oom[-_ ]kill|Out Of Memory|OOM Killer", re.I)  # slurmstepd: "Detected 1 oom_kill event"
# Codes a rank exits with on purpose (a verdict of ours, or a requested stop): not a failure of its own.
OUR_CODES = {int(c) for c in ExitCode if 80 <= c <= 89}
DONE_CODES = {0, int(ExitCode.PRE_TIMEOUT)}  # a command that returned with these finished its work
# Signals a process does not send itself: from outside the script (the kernel, an admin, a fault).
OUTSIDE_SIGNALS = ("Killed", "Terminated", "Hangup", "Interrupt", "Quit", "Bus error", "User defined signal")


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
    returned: dict[int, int] = field(default_factory=dict)  # rank -> its command's code, for ranks whose command returned
    steps: dict[int, int] = field(default_factory=dict)  # rank -> training steps it finished (from its heartbeats)
    oom: bool = False  # srun or slurmstepd reported an OOM kill in the step

    def host(self, rank: int) -> str:
        slot = rank // self.gpus_per_node
        return self.hosts[slot] if slot < len(self.hosts) else "?"

    def entry(self, rank: int, reason: str) -> dict[str, Any]:
        return {"rank": rank, "host": self.host(rank), "gpu": self.gpus.get(rank), "reason": reason}


EVIDENCE_RANKS = 32  # ranks a verdict names besides its culprits (and a straggler's evidence, with their losses)


def name_victims(victims: list[int], near: Callable[[int], bool], said: Callable[[int], str]
                 ) -> tuple[list[int], dict[str, Any]]:
    """The victims a verdict names, and its evidence's `victims` summary: every one when there are up to
    EVIDENCE_RANKS; past that, those `near` the culprits (their nodes' ranks) first, then ranks spread evenly,
    EVIDENCE_RANKS in all, and a count of all of them by what each was doing (`said`), most common first.

    Every victim named made verdict.json 4.9 MB at 16,384 ranks (at 100,000 a lost node named 99,992), written while
    every rank waited, and a stack file each on a hang."""
    if len(victims) <= EVIDENCE_RANKS:
        return victims, {}
    spread = victims[:: max(1, len(victims) // EVIDENCE_RANKS)]
    shown = sorted(list(dict.fromkeys([r for r in victims if near(r)] + spread))[:EVIDENCE_RANKS])
    doing = Counter(said(r) for r in victims)
    return shown, {"victims": {"count": len(victims), "named": len(shown), "doing": dict(doing.most_common(8))}}


def _as_signal(code: int | None) -> str:
    """128 + N is how a shell or a container runtime (Apptainer, bwrap) reports a process that signal N ended."""
    if not code or code <= 128:
        return ""
    try:
        return f" (128 + {signal.Signals(code - 128).name}: a signal, as a shell or container reports it)"
    except ValueError:
        return ""


@dataclass(frozen=True)
class Own:
    """Why one rank failed on its own: its evidence word (verdict.EVIDENCE) and the reason shown."""

    evidence: str
    why: str
    signature: str = ""  # errorpatterns.signature of its error, or of its code or signal
    early: bool = False  # a Python error that stops a script before its first step, and it came before one
    hardware: bool = False
    infrastructure: bool = False


def _own_failure(facts: Facts, rank: int, end: TaskEnd | None) -> Own | None:
    """Why this rank failed on its own, or None when what it reported is a peer's failure seen from here."""
    error = facts.errors.get(rank)
    if error is not None and not errorpatterns.is_peer_failure(error):
        line = errorpatterns.last_line(error)
        if errorpatterns.is_hardware(error):
            return Own("hardware", f"hardware or fabric error: {line}", errorpatterns.signature(error), hardware=True)
        early = errorpatterns.is_early(error) and facts.steps.get(rank, 0) == 0
        return Own("exception", f"script failed: {line}", errorpatterns.signature(error), early=early,
                   infrastructure=errorpatterns.is_infrastructure(error))
    if error is not None and errorpatterns.is_hardware(error):
        return Own("hardware", f"hardware or fabric error: {errorpatterns.last_line(error)}", hardware=True)
    if end is None or end.after_terminate or error is not None:
        return None
    if end.signalled:
        outside = end.what.startswith(OUTSIDE_SIGNALS) and not facts.oom
        return Own("signal" if outside else "exception", f"killed by a signal ({end.what}) before any peer failed",
                   f"signal {end.what}")
    if _failing_code(end.exit_code):
        return Own("exception", f"exited with code {end.exit_code}{_as_signal(end.exit_code)} on its own",
                   f"exit {end.exit_code}")
    return None


def blame_end(facts: Facts) -> Verdict | None:
    """The verdict of an attempt whose ranks failed; None when no rank failed (or every command returned)."""
    done = {r for r, code in facts.returned.items() if code in DONE_CODES}
    if len(done) >= facts.world and not facts.lost_nodes:
        return None  # every rank's work is done: what the processes' ends did afterwards is not a failure
    ended_by: dict[int, TaskEnd] = {}
    for end in facts.srun:
        for rank in end.ranks:
            ended_by.setdefault(rank, end)
    failed = (set(facts.errors) | {r for r, e in ended_by.items() if e.signalled or _failing_code(e.exit_code)}) - done
    if not failed and not facts.lost_nodes:
        return None

    lost = _lost_node(facts, ended_by)
    if lost is not None:
        return lost

    own = {r: why for r in sorted(failed) if (why := _own_failure(facts, r, ended_by.get(r))) is not None}
    fault, code, culprits, summary = _judge(facts, own)
    if not culprits and failed:
        # Every failure looks like a reaction: name whoever failed first, blame nobody.
        first = min(failed, key=lambda r: (facts.deaths.get(r, float("inf")), r))
        culprits = {first: Own("exception", "failed first; every failure reported looks like a reaction to a peer")}
        fault, code, summary = FAULT_AMBIGUOUS, int(ExitCode.SCRIPT_FAILED), ""
    order = sorted(culprits, key=lambda r: (facts.deaths.get(r, float("inf")), _srun_position(facts, r), r))
    stopped = [r for r in range(facts.world) if r not in culprits and (r in failed or r in ended_by) and r not in done]
    primary = order[0]
    evidence: dict[str, Any] = {
        "srun": [f"{e.node}: task(s) {','.join(map(str, e.ranks))}: {e.what}" for e in facts.srun],
    }
    victims, counted = _victim_entries(facts, stopped, {facts.host(r) for r in order}, ended_by)
    evidence.update(counted)
    if culprits[primary].signature:
        evidence["signature"] = culprits[primary].signature
    end = ended_by.get(primary)
    if end is not None:
        evidence["how"] = end.what
    if primary in facts.errors:
        evidence["traceback"] = facts.errors[primary]
    if primary in facts.deaths:
        evidence["died_at"] = facts.deaths[primary]
    if done:
        evidence["returned"] = sorted(done)
    more = f" (+{len(order) - 1} more: {_ranks_text(order[1:])})" if len(order) > 1 else ""
    message = summary or (
        f"rank {primary} on {facts.host(primary)} failed: {culprits[primary].why}{more};"
        f" {len(stopped)} rank(s) stopped because of it"
    )
    return Verdict(
        False,
        code,
        message,
        [{**facts.entry(r, culprits[r].why), "evidence": culprits[r].evidence} for r in order],
        evidence,
        victims,
        fault=fault,
    )


def _judge(facts: Facts, own: dict[int, Own]) -> tuple[str, int, dict[int, Own], str]:
    """Whose fault the ranks' own failures are: (fault, code, the culprits, a message when the rule has its own)."""
    if not own:
        return FAULT_AMBIGUOUS, int(ExitCode.SCRIPT_FAILED), {}, ""
    nodes_all = set(facts.hosts[: -(-facts.world // facts.gpus_per_node)]) if facts.hosts else set()

    def every_node(ranks: list[int]) -> bool:
        return len(ranks) == facts.world or (bool(nodes_all) and {facts.host(r) for r in ranks} >= nodes_all)

    hardware = {r: o for r, o in own.items() if o.hardware}
    if hardware:
        return FAULT_NODE, int(ExitCode.SCRIPT_FAILED), hardware, ""
    killed = {r: o for r, o in own.items() if o.evidence == "signal"}
    if killed and not every_node(list(killed)):
        return FAULT_NODE, int(ExitCode.SCRIPT_FAILED), killed, ""
    early = {r: o for r, o in own.items() if o.early}
    if early:
        return FAULT_SCRIPT, int(ExitCode.SCRIPT_ERROR), early, _script_message(facts, early, "before its first step")
    signatures = {o.signature for o in own.values()}
    if len(signatures) == 1 and every_node(list(own)):
        first = next(iter(own.values()))
        if first.infrastructure:
            return FAULT_INFRASTRUCTURE, int(ExitCode.SCRIPT_FAILED), own, ""
        if first.evidence == "exception":
            return FAULT_SCRIPT, int(ExitCode.SCRIPT_ERROR), own, _script_message(facts, own, "the same way")
    return FAULT_AMBIGUOUS, int(ExitCode.SCRIPT_FAILED), own, ""


def _script_message(facts: Facts, culprits: dict[int, Own], how: str) -> str:
    """The script's verdict in one line: every rank named by count, the exception quoted, no node blamed."""
    ranks = sorted(culprits)
    nodes = sorted({facts.host(r) for r in ranks})
    quoted = culprits[ranks[0]].why.removeprefix("script failed: ")
    where = f"every rank ({len(ranks)})" if len(ranks) == facts.world else f"{len(ranks)} rank(s) on every node"
    if how != "the same way":
        where = f"{len(ranks)} rank(s) on {len(nodes)} node(s) ({_ranks_text(ranks)})"
    known = errorpatterns.hint(quoted)
    return (f"the script failed {how} on {where}: {quoted}; this is the script's error, not a node's:"
            " no node is blamed and the run stops (fix it, then `clusterctl requeue RUN`)" + (f"; {known}" if known else ""))


def _ranks_text(ranks: list[int], shown: int = 8) -> str:
    """rank 1, rank 0, rank 2 (the first `shown`, then how many more)."""
    text = ", ".join(f"rank {r}" for r in ranks[:shown])
    return text + (f" and {len(ranks) - shown} more" if len(ranks) > shown else "")


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
    mine = set(ranks)
    stopped = [r for r in range(facts.world) if r not in mine and (r in facts.errors or r in ended_by or not ended_by)]
    victims, counted = _victim_entries(facts, stopped, {node}, ended_by)
    entries = [{**facts.entry(r, f"node {node} lost"), "evidence": "lost"} for r in ranks]
    return Verdict(
        False,
        int(ExitCode.NODE_LOST),
        f"node {node} lost: its aggregator and all its {len(ranks)} rank(s) ({ranks[0]}..{ranks[-1]}) vanished at"
        f" once; {len(stopped)} rank(s) elsewhere stopped because of it",
        entries,
        {
            "node": node,
            "aggregator_lost_at": when,
            "srun": [f"{e.node}: task(s) {','.join(map(str, e.ranks))}: {e.what}" for e in facts.srun],
            **counted,
        },
        victims,
        fault=FAULT_NODE,
    )


def _victim_entries(facts: Facts, stopped: list[int], nodes: set[str], ended_by: dict[int, TaskEnd]
                    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The entries of the victims a verdict names (name_victims: those on `nodes` first) and the count of all."""
    def said(r: int) -> str:
        return _victim_reason(facts, r, ended_by.get(r))

    named, counted = name_victims(stopped, lambda r: facts.host(r) in nodes, said)
    return [facts.entry(r, said(r)) for r in named], counted


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
        return f"peer failure seen here: {errorpatterns.last_line(error)}"
    if end is not None:
        return f"stopped by srun after the culprit ended ({end.what})"
    return "stopped after the culprit ended"

"""What happens to a run after an attempt ends: the restart policy, as one pure function.

The batch script asks after every attempt (through runtime/recovery/nextattempt.py,
which gathers the facts and carries the decision out). The policy, from the
exit-code table in the reference (clusterctl/exitcodes.py):

* 0 ends the run; 93 (do not requeue) and 87 stop it; so does a cancel, recorded
  as 89 whatever code the stopped ranks or the controller gave.
* 85 (pre-timeout or preemption, checkpoint committed) leaves the allocation:
  the run continues in a new job (continuation, or `scontrol requeue`), never
  counted against `restart.budget`. When Slurm requeued the job itself
  (preemption with PreemptMode=REQUEUE, `scontrol requeue`), that requeue is
  the continuation: nothing more is submitted.
* 88 (the script's own error: the same on every rank, or a Python error
  before the first step) stops the run at once, blaming no node.
* Faults (80 rendezvous, 81 preflight, 82 hang, 83 straggler, 84 script,
  86 node lost) count against the budget. Whose fault the verdict says it is
  (rundir/verdict.FAULTS; docs/guide/verdicts.md) decides what a node pays:
  - `node` evidence excludes the culprits' nodes at once (81, 82 with a
    stopped process, 83, 86); for 84 (a kill from outside, a hardware
    error) the node is excluded when it fails a second time in the run;
  - `ambiguous` (one rank's exception, a hang with no stopped process)
    excludes nobody the first time. When the next fault is the same again:
    on the same rank with the same error (its signature) it follows the
    rank, not a node — the script's, and the run stops with 88; on the same
    node but another rank or error, while other nodes stay healthy, it
    follows the node, which is then excluded and becomes a suspect;
  - `infrastructure` (the same file-system or store error on every node)
    gets one restart, blaming nobody; a second in a row stops the run (87);
  - a verdict without a fault (written before faults were recorded) is
    judged by its code: 81, 82, 83 and 86 exclude, 84 on a second failure.
  The next attempt starts inside the allocation when enough healthy nodes
  are left (spares replace excluded nodes, the others keep their place),
  else in a new job that excludes them. 80 restarts in the allocation once
  per job, then moves on.
* An elastic job (run.json `elastic.widths`) that has no spare left for an
  excluded node shrinks instead of leaving the allocation: the next attempt
  runs on the largest planned width the healthy nodes fill (`shrink`), and
  with `elastic.grow` the full-size job is queued at once, to take over when
  Slurm starts it (runtime/recovery/nextattempt.py carries that out).
* A fault that repeats the previous one (same code, same culprit nodes) with
  no newer committed checkpoint in between, and excludes no new node, stops
  the run with 87: restarting would only fail again. (Not 80: its rule is
  once here, then a new job.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from clusterctl.backends.slurm.batchhost import SlurmEnd
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir.history import SCANCEL, Fault
from clusterctl.rundir.runjson import RunJson
from clusterctl.rundir.verdict import FAULT_AMBIGUOUS, FAULT_INFRASTRUCTURE, FAULT_NODE

FAULTS = frozenset({
    ExitCode.RENDEZVOUS_FAILED, ExitCode.PREFLIGHT_FAILED, ExitCode.HANG, ExitCode.STRAGGLER,
    ExitCode.SCRIPT_FAILED, ExitCode.NODE_LOST,
})
EXCLUDE_CULPRITS = frozenset({ExitCode.PREFLIGHT_FAILED, ExitCode.HANG, ExitCode.STRAGGLER, ExitCode.NODE_LOST})

Action = Literal["restart", "continue", "requeue", "slurm", "stop"]  # slurm: Slurm's own requeue goes on


@dataclass(frozen=True)
class Policy:
    budget: int = 3
    mode: Literal["continuation", "requeue", "none"] = "continuation"
    in_allocation: bool = True
    grow: bool = False  # elastic.grow: a shrink queues the full-size job at once (it takes over when it starts)

    @classmethod
    def from_run(cls, run: RunJson) -> Policy:
        r = run.restart
        return cls(int(r.budget), r.mode, bool(r.in_allocation),  # type: ignore[arg-type]
                   bool(run.elastic.grow and run.elastic.widths and r.mode != "none"))


@dataclass(frozen=True)
class Ended:
    """The attempt that just ended."""

    code: int
    culprit_hosts: tuple[str, ...] = ()  # the verdict's culprits' nodes, primary first
    committed_step: int | None = None  # newest committed checkpoint when it ended
    reason: str = ""  # the verdict's message, for the record
    fault: str = ""  # whose fault the verdict says it is (rundir/verdict.FAULTS); "" when it does not say
    culprit_ranks: tuple[int, ...] = ()  # the verdict's culprits' ranks, primary first
    signature: str = ""  # the primary culprit's error, numbers aside (runtime/errorpatterns.signature)


@dataclass(frozen=True)
class Situation:
    """Everything the decision needs besides the ended attempt."""

    job_id: str
    allocation: tuple[str, ...]  # every node of this job, in Slurm's order
    rank_hosts: tuple[str, ...]  # the nodes the ended attempt ran on, in slot order
    nodes: int  # how many nodes an attempt needs
    faults: tuple[Fault, ...] = ()  # earlier faults of the run, oldest first
    excluded: tuple[str, ...] = ()  # nodes the run already avoids (earlier culprits, the spec's, the user's)
    slurm_end: SlurmEnd = "running"
    cancel_by: str = ""  # who asked the run to stop (rundir.CANCEL), e.g. "clusterctl cancel"
    domain: Mapping[str, str] = field(default_factory=dict)  # node -> NVLink domain (block sites with segments)
    widths: tuple[int, ...] = ()  # an elastic job's smaller node counts, largest first (run.json elastic.widths;
    #                               none once its script failed at a shrunk width: history.unelastic)
    group_nodes: int = 1  # nodes one model-parallel group spans (tp*cp*pp ranks): kept in one domain when shrinking


@dataclass
class Decision:
    action: Action
    exit_code: int  # the batch script's own exit status
    record_code: int  # the code the run's history records for the attempt
    reason: str
    hosts: list[str] = field(default_factory=list)  # restart: the next attempt's nodes, slot order
    replaced: dict[str, str] = field(default_factory=dict)  # restart: excluded node -> the node taking its slot
    exclude: list[str] = field(default_factory=list)  # every node the run now avoids
    newly_excluded: list[str] = field(default_factory=list)  # blamed by this attempt: remembered as suspects
    shrunk: tuple[int, int] | None = None  # restart: an elastic job's (nodes before, nodes now) where it shrank
    grow: bool = False  # restart: also queue the full-size job now (elastic.grow), which takes over when it starts
    unelastic: bool = False  # the script failed at a shrunk width: the run shrinks no more
    counted: bool = False  # a fault restart, counted against restart.budget
    cancelled_by: str = ""  # the run stops because of a cancel: "clusterctl cancel", "scancel"


def blamed(ended: Ended, faults: tuple[Fault, ...]) -> list[str]:
    """The nodes this attempt's fault excludes, as its fault class says (the module docstring)."""
    hosts = list(dict.fromkeys(h for h in ended.culprit_hosts if h))
    fault = ended.fault or _fault_of_code(ended.code)
    if fault == FAULT_NODE and ended.code != ExitCode.SCRIPT_FAILED:
        return hosts
    if fault == FAULT_NODE:  # 84 on node evidence: a node failing a second time in the run
        before = {h for f in faults if f.code == ExitCode.SCRIPT_FAILED for h in f.hosts}
        return [h for h in hosts if h in before]
    if fault == FAULT_AMBIGUOUS and faults and follows_the_node(ended, faults[-1]):
        return [h for h in hosts if h in faults[-1].hosts]
    return []


def _fault_of_code(code: int) -> str:
    """A verdict that does not say whose fault it is (written before faults were recorded): by its code."""
    if code in EXCLUDE_CULPRITS or code == ExitCode.SCRIPT_FAILED:
        return FAULT_NODE
    return FAULT_AMBIGUOUS


def follows_the_rank(ended: Ended, previous: Fault) -> bool:
    """The same ambiguous failure again on the same primary rank with the same error: the script's (its data, a rank
    condition), not a node's; a node fault does not pick the same rank and the same words twice."""
    return (
        ended.fault == FAULT_AMBIGUOUS and previous.fault == FAULT_AMBIGUOUS and previous.code == ended.code
        and bool(ended.culprit_ranks) and previous.ranks[:1] == ended.culprit_ranks[:1]
        and bool(ended.signature) and previous.signature == ended.signature
    )


def follows_the_node(ended: Ended, previous: Fault) -> bool:
    """The same kind of ambiguous failure again on a node the previous one named, through another rank or error,
    while other nodes stayed healthy: the node's."""
    return (
        ended.fault == FAULT_AMBIGUOUS and previous.fault == FAULT_AMBIGUOUS and previous.code == ended.code
        and bool(set(ended.culprit_hosts) & set(previous.hosts)) and not follows_the_rank(ended, previous)
    )


def pick_hosts(rank_hosts: tuple[str, ...], allocation: tuple[str, ...], avoid: set[str], nodes: int,
               domain: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]] | None:
    """`nodes` healthy nodes of the allocation, spares in place of the avoided ones, in the allocation's
    order: srun's block distribution places ranks on a --nodelist in that order, whatever the list says.
    With `domain` (node -> NVLink domain, on a block site), a spare replaces a node of its own domain only:
    a spare from another rack would split the groups the segment keeps together."""
    current = list(rank_hosts[:nodes]) or list(allocation[:nodes])
    spares = [h for h in allocation if h not in avoid and h not in current]
    picked: list[str] = []
    replaced: dict[str, str] = {}
    for host in current:
        if host not in avoid:
            picked.append(host)
            continue
        same = [h for h in spares if not domain or domain.get(h) == domain.get(host)]
        if not same:
            return None
        spares.remove(same[0])
        replaced[host] = same[0]
        picked.append(same[0])
    while len(picked) < nodes:  # the ended attempt ran on fewer nodes (it never started)
        if not spares:
            return None
        picked.append(spares.pop(0))
    order = {h: i for i, h in enumerate(allocation)}
    return sorted(picked, key=lambda h: order.get(h, len(order))), replaced


def shrink(s: Situation, avoid: set[str]) -> list[str] | None:
    """An elastic job's next nodes when no spare is left: the largest planned width the healthy nodes of the
    allocation fill, the ended attempt's own nodes first (their snapshots are there), in the allocation's order.
    On a block site each model-parallel group's nodes stay in one NVLink domain: a domain gives whole groups
    only, and a width they cannot fill is skipped."""
    current = [h for h in s.rank_hosts if h not in avoid]
    healthy = current + [h for h in s.allocation if h not in avoid and h not in current]
    order = {h: i for i, h in enumerate(s.allocation)}
    if s.domain:
        size, by_domain = max(1, s.group_nodes), {}
        for h in healthy:
            by_domain.setdefault(s.domain.get(h, ""), []).append(h)
        healthy = [h for hosts in by_domain.values() for h in hosts[:len(hosts) // size * size]]
    for nodes in s.widths:
        if nodes > len(healthy):
            continue
        picked = sorted(healthy[:nodes], key=lambda h: order.get(h, len(order)))
        if not s.domain or _groups_in_domains(picked, s.domain, s.group_nodes):
            return picked
    return None


def _groups_in_domains(hosts: list[str], domain: Mapping[str, str], group_nodes: int) -> bool:
    """Whether every run of `group_nodes` consecutive nodes (one model-parallel group's) shares a domain."""
    size = max(1, group_nodes)
    return all(len({domain.get(h) for h in hosts[i:i + size]}) == 1 for i in range(0, len(hosts), size))


def place_in_domains(allocation: tuple[str, ...], nodes: int, domain: Mapping[str, str], per_segment: int,
                     spares_each: int) -> list[str] | None:
    """The first attempt's rank nodes on a block site: in each domain, the rank nodes of the segments Slurm put
    there, the rest its spares. None when the allocation does not hold whole segments in its domains (Slurm placed
    the job otherwise, e.g. a release without --segment)."""
    by_domain: dict[str, list[str]] = {}
    for host in allocation:
        by_domain.setdefault(domain.get(host, ""), []).append(host)
    picked = [h for name, hosts in by_domain.items() if name
              for h in hosts[:len(hosts) // (per_segment + spares_each) * per_segment]]
    if len(picked) != nodes:
        return None
    order = {h: i for i, h in enumerate(allocation)}
    return sorted(picked, key=order.__getitem__)


def decide(ended: Ended, s: Situation, policy: Policy) -> Decision:
    code = ended.code
    exclude = list(dict.fromkeys(s.excluded))
    if s.cancel_by or s.slurm_end == "cancelled" or code == ExitCode.CANCELLED:  # 89 whatever the ranks exited with
        who = f"by {s.cancel_by}" if s.cancel_by else "the job was cancelled (scancel)"
        return Decision("stop", int(ExitCode.CANCELLED), int(ExitCode.CANCELLED), f"stopped: {who}", exclude=exclude,
                        cancelled_by=s.cancel_by or SCANCEL)
    if code == ExitCode.OK:
        return Decision("stop", 0, 0, "every rank finished", exclude=exclude)
    if s.slurm_end == "requeued":
        return Decision("slurm", 0, code, "Slurm requeued the job: its next start continues the run", exclude=exclude)
    if code == ExitCode.DO_NOT_REQUEUE:
        return Decision("stop", code, code, "the job asked not to be requeued (exit 93)", exclude=exclude)
    if code == ExitCode.PRE_TIMEOUT or s.slurm_end in ("preempted", "timeout"):
        return _leave(Decision("continue", 0, int(ExitCode.PRE_TIMEOUT), "", exclude=exclude), policy,
                      "stopped before the time limit or a preemption with its checkpoint committed")
    if code == ExitCode.SCRIPT_ERROR and s.widths and 0 < len(s.rank_hosts) < s.nodes:
        return _leave(Decision("continue", code, code, "", exclude=exclude, counted=True, unelastic=True), policy,
                      f"{ended.reason or 'the script failed on every rank'}; it failed at the shrunk width ({len(s.rank_hosts)}"
                      f" of {s.nodes} nodes): a script that is not elastic (per-rank state, data split by the world size:"
                      " docs/guide/own-script.md, \"An elastic script\") cannot shrink, so the run shrinks no more and waits"
                      " for its full width")
    if code == ExitCode.SCRIPT_ERROR:
        return Decision("stop", code, code, ended.reason or "the script's own error: no node is blamed", exclude=exclude)
    if code not in FAULTS:
        return Decision("stop", code, code, f"exit {code} is not one a restart can help", exclude=exclude)

    what = f"exit {code}" + (f" ({ended.reason})" if ended.reason else "")
    previous = s.faults[-1] if s.faults else None
    if previous is not None and follows_the_rank(ended, previous):
        script = int(ExitCode.SCRIPT_ERROR)
        return Decision(
            "stop", script, script,
            f"{what}; the same failure on rank {ended.culprit_ranks[0]} as in the attempt before ({ended.signature}):"
            " it follows the rank, not a node, so it is the script's: no node is blamed and the run stops",
            exclude=exclude,
        )
    newly = [h for h in blamed(ended, s.faults) if h not in exclude]
    exclude += newly
    if policy.mode == "none":
        return Decision("stop", code, code, f"{what}; restart.mode is none", exclude=exclude, newly_excluded=newly)
    if ended.fault == FAULT_INFRASTRUCTURE and previous is not None and previous.fault == FAULT_INFRASTRUCTURE:
        return Decision(
            "stop", int(ExitCode.BUDGET_EXHAUSTED), int(ExitCode.BUDGET_EXHAUSTED),
            f"{what}; the same shared file-system or store error twice in a row: no node is to blame and a restart"
            " would fail again (fix what every node shares, then `clusterctl requeue RUN`)",
            exclude=exclude,
        )
    if (
        previous is not None and previous.code == code and code != ExitCode.RENDEZVOUS_FAILED and set(previous.hosts) == set(ended.culprit_hosts)
        and (ended.committed_step or -1) <= (previous.committed_step or -1) and not newly
    ):
        step = "no checkpoint" if ended.committed_step is None else f"the checkpoint of step {ended.committed_step}"
        return Decision(
            "stop", int(ExitCode.BUDGET_EXHAUSTED), int(ExitCode.BUDGET_EXHAUSTED),
            f"{what} twice in a row with no progress (still {step}): restarting would fail again",
            exclude=exclude, newly_excluded=newly,
        )
    if len(s.faults) >= policy.budget:
        return Decision(
            "stop", int(ExitCode.BUDGET_EXHAUSTED), int(ExitCode.BUDGET_EXHAUSTED),
            f"{what}; restart.budget {policy.budget} is spent ({len(s.faults)} fault restarts so far)",
            exclude=exclude, newly_excluded=newly,
        )
    rendezvous_again = code == ExitCode.RENDEZVOUS_FAILED and any(
        f.code == ExitCode.RENDEZVOUS_FAILED and f.job_id == s.job_id for f in s.faults
    )
    if policy.in_allocation and not rendezvous_again:
        picked = pick_hosts(s.rank_hosts, s.allocation, set(exclude), s.nodes, s.domain)
        if picked is not None:
            hosts, replaced = picked
            how = ", ".join(f"{a} -> {b}" for a, b in replaced.items())
            return Decision(
                "restart", code, code, f"{what}; restarting in the allocation" + (f" ({how})" if how else ""),
                hosts=hosts, replaced=replaced, exclude=exclude, newly_excluded=newly, counted=True,
            )
        fewer = shrink(s, set(exclude))
        if fewer is not None:
            before = len(s.rank_hosts) or s.nodes
            return Decision(
                "restart", code, code, f"{what}; no spare left: shrinking in the allocation from {before} to"
                f" {len(fewer)} nodes (elastic)", hosts=fewer, exclude=exclude, newly_excluded=newly, counted=True,
                shrunk=(before, len(fewer)), grow=policy.grow,
            )
        why = f"{what}; too few healthy nodes left in the allocation" + (
            f" (elastic: not even its smallest width, {s.widths[-1]} nodes)" if s.widths else "")
    elif rendezvous_again:
        why = f"{what}; the rendezvous already failed once in this job"
    else:
        why = f"{what}; restart.in_allocation is off"
    decision = Decision("continue", code, code, "", exclude=exclude, newly_excluded=newly, counted=True)
    return _leave(decision, policy, why)


def _leave(decision: Decision, policy: Policy, why: str) -> Decision:
    """The run goes on in a new job, as restart.mode says (or stops when it says none)."""
    if policy.mode == "none":
        decision.action, decision.exit_code = "stop", decision.record_code
        decision.reason = f"{why}; restart.mode is none"
    else:
        decision.action = "continue" if policy.mode == "continuation" else "requeue"
        decision.reason = f"{why}; continuing in a new job" if policy.mode == "continuation" else f"{why}; requeueing the job"
    return decision

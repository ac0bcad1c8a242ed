"""The exit-code table's effect column (clusterctl/exitcodes.py, the reference's exit-codes page) says what the
restart policy (runtime/recovery/policy.py) does: each code's ending, as its verdicts can carry it, is decided and
the documented words for what happened must be in its row."""

from __future__ import annotations

import pytest

from clusterctl.exitcodes import DESCRIPTIONS, ExitCode
from clusterctl.rundir.history import Fault
from clusterctl.rundir.verdict import FAULT_AMBIGUOUS, FAULT_INFRASTRUCTURE, FAULT_NODE
from clusterctl.runtime.recovery.policy import Decision, Ended, Policy, Situation, decide

ALLOC = ("n1", "n2", "n3")  # two nodes needed, one spare


def situation(*faults: Fault) -> Situation:
    return Situation(job_id="7", allocation=ALLOC, rank_hosts=("n1", "n2"), nodes=2, faults=faults)


def restarted_without_the_culprit(d: Decision) -> bool:
    return d.action == "restart" and d.newly_excluded == ["n2"] and "n2" not in d.hosts and d.counted


def restarted_in_place(d: Decision) -> bool:
    return d.action == "restart" and d.hosts == ["n1", "n2"] and not d.exclude and d.counted


def continued_uncounted(d: Decision) -> bool:
    return d.action == "continue" and d.exit_code == 0 and not d.counted


def stopped(d: Decision) -> bool:
    return d.action == "stop" and not d.newly_excluded


def before(code: ExitCode, fault: str = "", rank: int = 2) -> Fault:
    return Fault(int(code), ("n2",), 10, "7", fault=fault, ranks=(rank,), signature="OSError: [Errno 5] input/output error")


# (code, the fault its verdict says, the faults before it, what the policy must do, the words its row must hold)
CASES = [
    (ExitCode.OK, "", (), stopped, "-"),
    *[(code, "", (), stopped, "no") for code in (ExitCode.BUG, ExitCode.USAGE, ExitCode.DRILL_MISSED,
                                                  ExitCode.QUALIFY_FAILED, ExitCode.BAD_CONFIG,
                                                  ExitCode.BACKEND_UNAVAILABLE, ExitCode.NO_PERMISSION)],
    (ExitCode.RENDEZVOUS_FAILED, "", (), restarted_in_place, "restarts in the allocation once per job"),
    (ExitCode.RENDEZVOUS_FAILED, "", (before(ExitCode.RENDEZVOUS_FAILED),), lambda d: d.action == "continue" and d.counted,
     "then in a new job"),
    (ExitCode.PREFLIGHT_FAILED, FAULT_NODE, (), restarted_without_the_culprit, "restarts without the culprit's node"),
    (ExitCode.HANG, FAULT_NODE, (), restarted_without_the_culprit, "restarts without the culprit's node when its process"),
    (ExitCode.HANG, FAULT_AMBIGUOUS, (), restarted_in_place, "restarts in place the first time"),
    (ExitCode.HANG, FAULT_AMBIGUOUS, (before(ExitCode.HANG, FAULT_AMBIGUOUS, rank=3),), restarted_without_the_culprit,
     "excludes the node when it follows it"),
    (ExitCode.HANG, FAULT_AMBIGUOUS, (before(ExitCode.HANG, FAULT_AMBIGUOUS),),
     lambda d: stopped(d) and d.exit_code == ExitCode.SCRIPT_ERROR, "the same rank again is the script's (88)"),
    (ExitCode.SCRIPT_FAILED, FAULT_AMBIGUOUS, (), restarted_in_place, "one rank's error restarts in place"),
    (ExitCode.SCRIPT_FAILED, FAULT_AMBIGUOUS, (before(ExitCode.SCRIPT_FAILED, FAULT_AMBIGUOUS),),
     lambda d: stopped(d) and d.exit_code == ExitCode.SCRIPT_ERROR, "the same error on the same rank again is the script's (88)"),
    (ExitCode.STRAGGLER, FAULT_NODE, (), restarted_without_the_culprit, "restarts without the culprit's node"),
    (ExitCode.SCRIPT_FAILED, FAULT_NODE, (), restarted_in_place, "restarts in place"),
    (ExitCode.SCRIPT_FAILED, FAULT_NODE, (before(ExitCode.SCRIPT_FAILED, FAULT_NODE),), restarted_without_the_culprit,
     "a node failing twice is excluded"),
    (ExitCode.SCRIPT_FAILED, FAULT_INFRASTRUCTURE, (), restarted_in_place, "gets one restart"),
    (ExitCode.SCRIPT_FAILED, FAULT_INFRASTRUCTURE, (before(ExitCode.SCRIPT_FAILED, FAULT_INFRASTRUCTURE),),
     lambda d: stopped(d) and d.exit_code == ExitCode.BUDGET_EXHAUSTED, "then the run stops (87)"),
    (ExitCode.PRE_TIMEOUT, "", (), continued_uncounted, "continues in a new job (the job itself exits 0); not counted"),
    (ExitCode.NODE_LOST, FAULT_NODE, (), restarted_without_the_culprit, "restarts without the lost node"),
    (ExitCode.BUDGET_EXHAUSTED, "", (), stopped, "the run stops"),
    (ExitCode.SCRIPT_ERROR, "", (), lambda d: stopped(d) and d.exit_code == ExitCode.SCRIPT_ERROR,
     "the run stops at once; no node is blamed"),
    (ExitCode.CANCELLED, "", (), lambda d: stopped(d) and d.exit_code == ExitCode.CANCELLED, "the run stops"),
    (ExitCode.DO_NOT_REQUEUE, "", (), stopped, "the run stops"),
]


@pytest.mark.parametrize(("code", "fault", "earlier", "happens", "words"), CASES,
                         ids=[f"{int(c[0])}-{c[1] or 'code'}-{len(c[2])}" for c in CASES])
def test_the_documented_effect_is_what_the_policy_does(code: ExitCode, fault: str, earlier: tuple, happens,
                                                        words: str) -> None:
    decision = decide(Ended(int(code), ("n2",), 20, fault=fault, culprit_ranks=(2,),
                            signature="OSError: [Errno 5] input/output error"), situation(*earlier), Policy())
    assert happens(decision), decision
    assert words in DESCRIPTIONS[code][1], f"exit {int(code)}'s effect column does not say {words!r}"


def test_every_code_of_the_table_is_tied_to_the_policy() -> None:
    assert {c[0] for c in CASES} == set(ExitCode) == set(DESCRIPTIONS)

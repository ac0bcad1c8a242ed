"""Exit codes and verdicts: the one place that defines them.

Every process in a run (CLI, batch script, controller, ranks) exits with one
of these, so that the batch script can decide restart or requeue from the
code alone. 75/76 are avoided (Slurm's RequeueExit/RequeueExitHold on some
sites) and so is 128+n (death by signal).
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    BUG = 1
    USAGE = 2
    DRILL_MISSED = 3
    QUALIFY_FAILED = 4
    BAD_CONFIG = 65
    BACKEND_UNAVAILABLE = 69
    NO_PERMISSION = 77  # sysexits' EX_NOPERM
    RENDEZVOUS_FAILED = 80
    PREFLIGHT_FAILED = 81
    HANG = 82
    STRAGGLER = 83
    SCRIPT_FAILED = 84
    PRE_TIMEOUT = 85
    NODE_LOST = 86
    BUDGET_EXHAUSTED = 87
    SCRIPT_ERROR = 88  # the script's own error (the same on every rank, or before its first step): no node blamed
    CANCELLED = 89  # stopped from outside on purpose (scancel, clusterctl cancel): nobody's fault
    DO_NOT_REQUEUE = 93


# The codes of ours an attempt's processes pass on as they are (verdicts, and the reserved 93); any other exit of srun
# or of the controller is no verdict (srun's 137 after a cancel, a controller killed with a warm server's step).
PASSTHROUGH = frozenset(c for c in ExitCode if 80 <= c <= 89 or c == ExitCode.DO_NOT_REQUEUE)


# Meaning, and what each code does to the run (runtime/recovery/policy.py), as documented in the
# documentation's exit-codes page (generated from this table: clusterctl/docsgen/codes.py).
DESCRIPTIONS: dict[ExitCode, tuple[str, str]] = {
    ExitCode.OK: ("success", "-"),
    ExitCode.BUG: ("unexpected error (a bug: message + where to report)", "no"),
    ExitCode.USAGE: ("command-line usage", "no"),
    ExitCode.DRILL_MISSED: ("a drill's fault was not detected, or the wrong rank was blamed", "no"),
    ExitCode.QUALIFY_FAILED: ("a rung of clusterctl qualify failed (report.json says which and why)", "no"),
    ExitCode.BAD_CONFIG: ("bad spec or site config", "no"),
    ExitCode.BACKEND_UNAVAILABLE: (
        "backend unavailable (no sbatch, controller unreachable, SSH down)",
        "no",
    ),
    ExitCode.NO_PERMISSION: ("permission denied: a run or file of another user that is not shared with you (runs_mode)", "no"),
    ExitCode.RENDEZVOUS_FAILED: ("rendezvous failed", "restarts in the allocation once per job, then in a new job; counted"),
    ExitCode.PREFLIGHT_FAILED: (
        "preflight failed (culprit node named), or an NVLink-bound group placed across racks (its ranks and nodes named)",
        "restarts without the culprit's node (a spare takes its slot, else a new job excludes it); counted. A group"
        " across racks excludes no node: the restart runs where it ran and stops on the second such failure",
    ),
    ExitCode.HANG: (
        "hang verdict",
        "restarts without the culprit's node when its process was stopped; a hang with no stopped process restarts"
        " in place the first time, and excludes the node when it follows it to the next attempt (the same rank again is"
        " the script's (88): no node is blamed); counted",
    ),
    ExitCode.STRAGGLER: ("straggler verdict", "restarts without the culprit's node; counted"),
    ExitCode.SCRIPT_FAILED: (
        "a rank's script failed (traceback in verdict.json)",
        "restarts in place; a node failing twice is excluded; one rank's error restarts in place and the same error on"
        " the same rank again is the script's (88); the same file-system or store error on every node gets one"
        " restart, then the run stops (87); counted",
    ),
    ExitCode.PRE_TIMEOUT: (
        "pre-timeout or preempted, checkpoint committed",
        "continues in a new job (the job itself exits 0); not counted",
    ),
    ExitCode.NODE_LOST: ("node lost", "restarts without the lost node; counted"),
    ExitCode.BUDGET_EXHAUSTED: ("restart budget exhausted or no progress", "the run stops"),
    ExitCode.SCRIPT_ERROR: (
        "the script's own error: the same exception on every rank (or on ranks of every node), or a Python error"
        " before the first step (syntax, import, a missing file, argparse); the verdict quotes it",
        "the run stops at once; no node is blamed and no restart is spent on an error that would repeat",
    ),
    ExitCode.CANCELLED: (
        "cancelled: scancel, clusterctl cancel or an admin stopped the job; nobody is blamed",
        "the run stops (clusterctl requeue continues it)",
    ),
    ExitCode.DO_NOT_REQUEUE: ('reserved: nvidia-resiliency-ext "do not requeue"', "the run stops"),
}

BUG_REPORT_HINT = "this is a bug in clusterctl; please report it with the command and the message above"


def meaning(code: int | None) -> str:
    """What an exit code meant, in a few words (DESCRIPTIONS), for attempts tables and histories."""
    if code is None:
        return "no exit recorded"
    try:
        return DESCRIPTIONS[ExitCode(code)][0]
    except (ValueError, KeyError):
        return f"exit {code}"

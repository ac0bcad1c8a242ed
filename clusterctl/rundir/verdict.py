"""verdict.json: an attempt's verdict — its type, its JSON, and the one function that writes the file.

The controller's verdict says whether the rendezvous passed and, when an
attempt failed, who is to blame: culprits (the ranks that caused it,
primary first) apart from victims (ranks that failed because a culprit
did), with evidence. Keys (kept; keys may be added, never renamed):

    format     this file's layout version (FORMAT); absent in files written before it existed
    ok         the rendezvous passed and nothing failed
    code       the exit code the verdict stands for (exitcodes.ExitCode)
    verdict    the code's name in lower case (rendezvous_failed, hang, straggler, ...)
    message    one line for people
    fault      whose fault the evidence says it is (FAULTS): script, node, ambiguous, infrastructure; ""
               for an attempt that did not fail, and in files written before the key existed
    culprits   [{rank, host, reason, gpu?, evidence?, ...}], primary first; evidence: what points at
               the rank (a word of EVIDENCE)
    victims    [{rank, host, reason}]: every one up to 32; past that 32 named (the culprits' nodes' first,
               then spread evenly), and evidence.victims = {count, named, doing}: all of them, counted by
               what each was doing
    evidence   what the verdict was decided from (stacks, samples, srun's lines, ...)
    time       when it was given (seconds since the epoch)

The batch script looks into the file for one thing only, with grep: whether
a failing verdict has been given, to give srun its grace (`"ok": false` must
stay exactly as written here: indent 1, sorted keys, jsonio.write_json_atomic).
The attempt's code reaches it from the recovery step, which reads the file.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterctl.exitcodes import ExitCode
from clusterctl.rundir.history import SCANCEL
from clusterctl.rundir.jsonio import read_json, write_json_atomic
from clusterctl.rundir.layout import VERDICT

FORMAT = 2  # 1: the files written before the format was recorded


# Whose fault a failed attempt is (docs/guide/verdicts.md, "Who is at fault"), as the evidence says:
FAULT_SCRIPT = "script"  # the same error on every rank (or ranks of every node), or a Python error before the first step
FAULT_NODE = "node"  # evidence that points at a node: lost, a stopped or slow process, preflight, hardware, a signal from outside
FAULT_AMBIGUOUS = "ambiguous"  # one rank's exception, a hang with no stopped process: nobody yet
FAULT_INFRASTRUCTURE = "infrastructure"  # the same file-system or store error on every node: shared, nobody's node
FAULTS = (FAULT_SCRIPT, FAULT_NODE, FAULT_AMBIGUOUS, FAULT_INFRASTRUCTURE)
# What points at a culprit (its entry's "evidence"; `clusterctl suspects` shows it for each node blamed).
EVIDENCE = {
    "lost": "its node vanished: aggregator and ranks at once",
    "stopped": "its process stopped, or its liveness beat did",
    "slow": "its compute time stayed above its peers'",
    "preflight": "a check of its node failed",
    "hardware": "a hardware or fabric error (ECC, Xid, NVLink, NIC)",
    "signal": "killed by a signal from outside the script",
    "repeated": "the same failure followed its node to another attempt while other nodes stayed healthy",
    "exception": "its own error (the script's, or ambiguous)",
    "stalled": "no progress while alive: outside the collective its peers wait in, or behind them",
}

# The keys as_dict writes besides the fields (the records reference lists them from here).
ADDED_KEYS = {"format": "the file's layout version", "verdict": "the code's name in lower case (hang, straggler, ...), or the number"}


@dataclass
class Verdict:
    ok: bool  # false when the attempt failed
    code: int  # the exit code the verdict gives the attempt (ExitCode)
    message: str  # one line for a person: what happened, the culprit rank and host
    culprits: list[dict[str, Any]] = field(default_factory=list)  # {"rank", "host", "gpu", "reason"}, primary first
    evidence: dict[str, Any] = field(default_factory=dict)  # what the finding rests on: timeouts, phases, stacks, srun lines
    victims: list[dict[str, Any]] = field(default_factory=list)  # ranks that failed because a culprit did
    time: float = field(default_factory=time.time)  # when the verdict was given
    fault: str = ""  # FAULTS: whose fault the evidence says it is ("" when the attempt did not fail)

    @property
    def name(self) -> str:
        """The code's name in lower case (`hang`), or the number when it is not one of ours."""
        return ExitCode(self.code).name.lower() if self.code in ExitCode._value2member_map_ else str(self.code)

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "ok": self.ok,
            "code": self.code,
            "verdict": self.name,
            "message": self.message,
            "fault": self.fault,
            "culprits": self.culprits,
            "victims": self.victims,
            "evidence": self.evidence,
            "time": self.time,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Verdict":
        """From verdict.json (either format) or the store's copy; missing keys take harmless defaults."""
        code = data.get("code")
        when = data.get("time")
        return cls(
            ok=bool(data.get("ok", True)),
            code=code if isinstance(code, int) and not isinstance(code, bool) else 0,
            message=str(data.get("message") or ""),
            culprits=[c for c in data.get("culprits") or [] if isinstance(c, dict)],
            evidence=data.get("evidence") if isinstance(data.get("evidence"), dict) else {},
            victims=[v for v in data.get("victims") or [] if isinstance(v, dict)],
            time=float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else 0.0,
            fault=data["fault"] if data.get("fault") in FAULTS else "",
        )

    def culprit_hosts(self) -> list[str]:
        """The culprits' nodes, primary first, each once; not those named only where they are (`exclude: false`,
        e.g. an NVLink group split across racks: the nodes are healthy)."""
        return list(dict.fromkeys(str(c["host"]) for c in self.culprits if c.get("host") and c.get("exclude", True)))


# Slurm's own stops from outside (backends/slurm/batchhost.ending): no cancel, and the run goes on (85).
SLURM_STOPS: dict[str, str] = {
    "timeout": "Slurm stopped the job at its time limit",
    "preempted": "Slurm preempted the job",
    "requeued": "Slurm requeued the job",
    "running": "the job was stopped from outside while Slurm still runs it (a preemption's warning, say)",
}


def stopped_from_outside(end: str, cancelled_by: str, when: str = "") -> Verdict:
    """The verdict of an attempt stopped from outside, naming no node: a cancel (89, by `cancelled_by`, or Slurm's
    scancel when `end` is "cancelled") or one of Slurm's own stops (85, SLURM_STOPS). The controller gives it; the
    recovery step records a cancel's where the controller was killed first (a warm server's step ends with the job)."""
    if cancelled_by or end == "cancelled":
        return Verdict(False, int(ExitCode.CANCELLED),
                       f"cancelled by {cancelled_by or SCANCEL}: the job was stopped from outside{when}; no node is blamed")
    return Verdict(False, int(ExitCode.PRE_TIMEOUT), f"{SLURM_STOPS.get(end, SLURM_STOPS['running'])}{when}; no node is blamed")


def path(attempt_dir: Path) -> Path:
    return Path(attempt_dir) / VERDICT


def read(attempt_dir: Path) -> Verdict | None:
    """The attempt's verdict, or None while there is none (or the file is being written)."""
    data = read_json(os.path.join(attempt_dir, VERDICT))  # a string join: status reads thousands of these
    return Verdict.from_dict(data) if data is not None else None


def write(attempt_dir: Path, verdict: Verdict) -> None:
    """The one writer of verdict.json (called by runtime/controller/keeper.py, the attempt's one verdict keeper)."""
    write_json_atomic(path(attempt_dir), verdict.as_dict())

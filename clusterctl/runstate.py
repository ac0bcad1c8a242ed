"""A run's state: the one function that derives it, for every command that shows one.

Facts have one writer each (the batch script and the recovery step append to
attempts.jsonl, the controller writes verdict.json, rank 0 writes
metrics.jsonl, `submit` writes state.json); this module is their one reader.
The scheduler is asked at most once for all the runs shown, and only about
jobs the run directory cannot settle; a job it has forgotten is read from the
run directory alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The states a run can be in (`status --json` key `state`).
PENDING = "pending"
STARTING = "starting"
TRAINING = "training"
RESTARTING = "restarting"
CONTINUED = "continued"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
STATES = (PENDING, STARTING, TRAINING, RESTARTING, CONTINUED, COMPLETED, FAILED, CANCELLED)
FINAL = (COMPLETED, FAILED, CANCELLED)


@dataclass
class Attempt:
    """One launch of all ranks, as the run directory tells it."""

    attempt: int
    job_id: str
    nodes: list[str]
    start: float | None
    end: float | None  # None while it runs
    exit_code: int | None
    meaning: str  # what the exit code meant, or why the attempt ended
    steps: int  # steps done in this attempt
    first_step: int | None = None
    last_step: int | None = None
    gpus: int = 0  # GPUs allocated to it (nodes x GPUs per node, spares included)
    kept_steps: int = 0  # its steps that the run kept (not redone after a restart)
    kept_s: float = 0.0  # wall time of the kept steps
    next: str | None = None  # how the run went on: rundir.NEXT_* (allocation, continuation, ...)
    next_job: str | None = None
    verdict: str = ""  # the controller's one-line verdict when it was not ok
    culprits: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RunState:
    run: str
    path: Path
    name: str
    state: str  # one of STATES
    reason: str  # why: Slurm's pending reason, the verdict, the stop reason
    job_id: str | None  # the job the run is in now (or ended in)
    step: int | None
    loss: float | None
    tokens_per_s: float | None
    eta_s: float | None
    total_steps: int | None
    attempts: list[Attempt]
    checkpoint: int | None  # latest committed step
    goodput: float | None  # fraction of allocated GPU time spent in steps that were kept
    lost_gpu_hours: float | None
    allocated_gpu_hours: float | None
    exit_code: int | None
    submitted: float | None
    last_change: float | None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["path"] = str(self.path)
        return data

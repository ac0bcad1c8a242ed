"""The backend interface: submit a rendered batch script, ask about it, cancel it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode


@dataclass(frozen=True)
class Submission:
    job_id: str  # the scheduler's own id: SLURM_JOB_ID inside the job, %j in file names
    backend: str


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str  # Slurm's words: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    reason: str = ""  # "" when Slurm says None
    nodes: str = ""  # hostlist expression; "" until nodes are allocated
    exit_code: int | None = None  # the batch script's exit status as Slurm records it (0 until it ends)
    exit_signal: int | None = None  # the signal that ended it, when one did
    requeue_count: int = 0  # Slurm's Restarts: how often the job was requeued
    batch_host: str = ""  # the node running the batch shell, where the scheduler says so

    @property
    def finished(self) -> bool:
        return self.state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED", "RESIZING")


class Backend(ABC):
    name: str

    @abstractmethod
    def check(self) -> None:
        """Raise ClusterctlError (exit 69) when the backend cannot take jobs; called before anything is written."""

    @abstractmethod
    def submit(self, script: Path, workdir: Path, options: list[str] | None = None) -> Submission:
        """Submit the batch script (sbatch `options` override its #SBATCH lines); raise ClusterctlError
        with the scheduler's own reason."""

    @abstractmethod
    def info(self, job_id: str) -> JobInfo | None:
        """The job's state, or None when the scheduler no longer knows it."""

    def info_many(self, job_ids: Sequence[str]) -> dict[str, JobInfo | None]:
        """Several jobs in one scheduler query: `status` shows many runs and must not ask once per job.

        This default asks one job at a time, for backends without a scheduler to spare (local)."""
        return {job_id: self.info(job_id) for job_id in job_ids}

    @abstractmethod
    def cancel(self, job_id: str) -> None:
        """Cancel the job (all its steps)."""

    @abstractmethod
    def signal(self, job_id: str, sig: str) -> None:
        """Send signal `sig` (USR2, TERM: no SIG prefix) to the job's batch shell, as --signal=B: would."""

    def set_excluded(self, job_id: str, nodes: list[str]) -> None:
        """Replace a pending job's excluded nodes (scontrol update ExcNodeList); raise ClusterctlError with the
        scheduler's reason (a job no longer pending refuses)."""
        raise ClusterctlError(f"the {self.name} backend cannot change job {job_id}'s excluded nodes", ExitCode.USAGE)

    def display_id(self, job_id: str) -> str:
        """The job's id as messages, state.json and the user show it; info() and cancel() take it too.

        Slurm's own id here. A backend whose ids count like Slurm's but name
        other jobs (the local one) gives them a form of their own, so that
        "job 2" never means two different jobs.
        """
        return job_id

"""Submit a job: validate, create the run directory, hand the batch script to a backend.

A dry run follows the same path and stops before the backend, so what it
leaves on disk is exactly what a submission would submit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusterctl.backends import Backend, get_backend
from clusterctl.errors import ClusterctlError
from clusterctl.job import Job
from clusterctl.rundir import RunDir
from clusterctl.runfiles import create_run


# Pending reasons that no amount of waiting resolves: the job as asked cannot run here.
HOPELESS_REASONS = frozenset(
    {
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "PartitionConfig",
        "BadConstraints",
        "AccountNotAllowed",
        "InvalidAccount",
        "InvalidQOS",
        "QOSMaxNodePerJobLimit",
        "QOSMaxWallDurationPerJobLimit",
        "QOSMaxGRESPerJob",
    }
)


@dataclass(frozen=True)
class Submitted:
    run: RunDir
    job_id: str | None  # the scheduler's id: SLURM_JOB_ID inside the job, slurm-<id>.out
    backend: str
    warnings: tuple[str, ...] = ()
    display_id: str | None = None  # the job as the user sees it (`local-N` on the local backend), as in state.json


def default_backend(job: Job) -> str:
    """The embedded local site runs locally; every other site goes to Slurm."""
    return "local" if job.site.name == "local" else "slurm"


def submit_job(job: Job, backend_name: str | None = None, *, dry_run: bool = False) -> Submitted:
    name = backend_name or default_backend(job)
    backend = get_backend(name)
    if not dry_run:
        backend.check()  # before anything is written: no sbatch, no run directory
    run = create_run(job)
    if dry_run:
        run.write_state(state="dry-run", backend=name)
        return Submitted(run, None, name)
    try:
        submission = backend.submit(run.sbatch, Path.cwd())
    except ClusterctlError as exc:
        run.write_state(state="failed", backend=name, reason=exc.message, exit_code=int(exc.exit_code))
        raise
    except BaseException as exc:
        run.write_state(state="failed", backend=name, reason=f"{type(exc).__name__}: {exc}")
        raise
    shown = backend.display_id(submission.job_id)
    run.write_state(state="submitted", backend=name, job_id=shown)
    return Submitted(run, submission.job_id, name, tuple(_first_look(backend, submission.job_id)), shown)


def _first_look(backend: Backend, job_id: str) -> list[str]:
    """Warn when the scheduler has already said the job will never start as asked."""
    try:
        info = backend.info(job_id)
    except ClusterctlError:
        return []
    if info is not None and info.state == "PENDING" and info.reason in HOPELESS_REASONS:
        return [
            f"job {backend.display_id(job_id)} is pending with reason {info.reason}: Slurm will not start it as asked"
            f" (cancel it with scancel {job_id} and change the spec)"
        ]
    return []

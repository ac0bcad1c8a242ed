"""The jobs of a run: which it has had, which still run, and stopping them (for cancel and requeue).

A run outlives its jobs (the submitted one, continuations, requeues); the
run's history (rundir/history.py) lists them, the backend says which still
run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clusterctl.backends import Backend, JobInfo, get_backend
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir, history, runjson

POLL_S = 0.5
PROGRESS_EVERY_S = 5.0


@dataclass
class Report:
    """What a cancel or requeue did, for the terminal and for --json."""

    run: str
    cancelled: list[str] = field(default_factory=list)  # jobs cancelled outright
    stopped: list[str] = field(default_factory=list)  # running jobs asked to save and stop, that did
    submitted: str | None = None  # requeue: the new job
    exclude: list[str] = field(default_factory=list)
    resume_step: int | None = None  # requeue: the committed checkpoint the new job resumes from
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def backend_of(run: RunDir) -> Backend:
    name = run.read_state().get("backend")
    if name not in ("local", "slurm"):
        raise ClusterctlError(
            f"run {run.path.name} was never submitted (state.json has no backend): nothing to act on", ExitCode.USAGE
        )
    return get_backend(name)


def run_jobs(run: RunDir) -> list[str]:
    """Every job id the run has had, oldest first (the scheduler's own ids)."""
    return history.read(run).jobs


def active_jobs(run: RunDir, backend: Backend) -> list[JobInfo]:
    found = []
    for job_id in run_jobs(run):
        info = backend.info(job_id)
        if info is not None and not info.finished:
            found.append(info)
    return found


def wait_ended(backend: Backend, job_ids: list[str], timeout: float, show: Callable[[str], None]) -> list[str]:
    """Wait until the jobs have ended; the ones still running at the timeout."""
    start = time.monotonic()
    shown = 0.0
    while True:
        left = [j for j in job_ids if (info := backend.info(j)) is not None and not info.finished]
        elapsed = time.monotonic() - start
        if not left or elapsed >= timeout:
            return left
        if elapsed - shown >= PROGRESS_EVERY_S:
            show(f"{elapsed:.0f} s: waiting for job{'s' if len(left) > 1 else ''} {', '.join(backend.display_id(j) for j in left)} to save and stop")
            shown = elapsed
        time.sleep(POLL_S)


def stop_jobs(
    run: RunDir, backend: Backend, save: bool, timeout: float, show: Callable[[str], None], report: Report,
    jobs: list[JobInfo] | None = None,
) -> None:
    """Pending jobs are cancelled; running ones save first when asked (the pre-timeout signal), else are cancelled."""
    signal_name = (runjson.read(run.path) or runjson.RunJson()).signal.name
    for info in active_jobs(run, backend) if jobs is None else jobs:
        if save and info.state == "RUNNING":
            backend.signal(info.job_id, signal_name)
            show(f"asked job {backend.display_id(info.job_id)} to save a checkpoint and stop")
            left = wait_ended(backend, [info.job_id], timeout, show)
            if left:
                report.notes.append(f"job {backend.display_id(info.job_id)} did not stop within {timeout:g} s: cancelled")
                backend.cancel(info.job_id)
                report.cancelled.append(backend.display_id(info.job_id))
            else:
                report.stopped.append(backend.display_id(info.job_id))
        else:
            backend.cancel(info.job_id)
            report.cancelled.append(backend.display_id(info.job_id))
    # A running job cancelled outright may still be deciding: its marker-aware recovery step submits
    # nothing, and anything it submitted before the marker appeared is caught here.
    for _ in range(3):
        late = active_jobs(run, backend)
        if not late:
            break
        for info in late:
            backend.cancel(info.job_id)
            report.cancelled.append(backend.display_id(info.job_id))
        time.sleep(POLL_S)
    report.cancelled = list(dict.fromkeys(report.cancelled))

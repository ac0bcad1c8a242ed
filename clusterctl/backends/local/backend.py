"""The local backend: this machine as a small Slurm cluster (the embedded default).

It runs the *same* rendered batch script as the Slurm backend. A detached
supervisor per job plays the scheduler (dependencies, time limit, --signal,
requeue, cancel) and shims for srun, scontrol, sbatch, squeue and scancel,
first on the job's PATH, emulate Slurm's environment: SLURM_* and
SLURMD_NODENAME per emulated node (node1..node4 unless CLUSTERCTL_LOCAL_NODES
says otherwise). See clusterctl.backends.local for the details and for
what differs from real Slurm.

Job records live in $CLUSTERCTL_LOCAL_STATE (default
~/.local/state/clusterctl/local); job ids count up from 1 per state directory.
Inside the job, and to the shims, a job's id is that number, as Slurm's
would be (SLURM_JOB_ID, %j, the master port's hash); everywhere clusterctl
shows it, it is `local-N`, so that local job 2 is never mistaken for Slurm's
job 2. info() and cancel() take either form.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

from clusterctl.backends.base import Backend, JobInfo, Submission
from clusterctl.backends.local import STATE_ENV
from clusterctl.backends.local.control import ControlError, cancel_job, find, signal_job, update_job
from clusterctl.backends.local.records import JobRecord, SubmitError, state_root, submit
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import access, jobid
from clusterctl.syntax.hostlist import compress


def display_id(job_id: int | str) -> str:
    """`local-N` for the emulated Slurm's job N (either form given)."""
    return jobid.display(str(job_id), "local") or str(job_id)


def native_id(job_id: str) -> str | None:
    """The emulated Slurm's job number from `N` or `local-N`; None for anything else."""
    number = jobid.local_number(job_id)
    return str(number) if number is not None else None


class LocalBackend(Backend):
    name = "local"

    def __init__(self, state_dir: Path | None = None) -> None:
        self._state_dir = state_dir

    @property
    def root(self) -> Path:
        return self._state_dir if self._state_dir is not None else state_root()

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env[STATE_ENV] = str(self.root)
        return env

    def check(self) -> None:
        if shutil.which("bash") is None:
            raise ClusterctlError(
                "bash is not on PATH: the local backend runs the batch script with bash", ExitCode.BACKEND_UNAVAILABLE
            )
        if not os.path.isdir("/proc/self"):
            raise ClusterctlError(
                "the local backend needs Linux (/proc) to track a job's processes", ExitCode.BACKEND_UNAVAILABLE
            )
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise ClusterctlError(
                f"cannot create the local backend's state directory {self.root}: {exc.strerror}"
                f" (set {STATE_ENV} to a writable directory)",
                ExitCode.BACKEND_UNAVAILABLE,
            ) from None

    def submit(self, script: Path, workdir: Path, options: list[str] | None = None) -> Submission:
        try:
            umask, env = access.submission(script.parent, self._env())
            job_id = submit(script, workdir, options=list(options or []), env=env,
                            python=sys.executable,
                            umask=umask)
        except SubmitError as exc:
            raise ClusterctlError(f"the local backend rejected the job: {exc}", ExitCode.BAD_CONFIG) from None
        return Submission(job_id=str(job_id), backend=self.name)

    def display_id(self, job_id: str) -> str:
        return display_id(job_id)

    def info(self, job_id: str) -> JobInfo | None:
        number = native_id(str(job_id))
        if number is None:
            return None
        record = JobRecord(self.root, number)
        if not record.exists():
            return None
        try:
            state = record.effective_state()
        except FileNotFoundError:
            return None
        return JobInfo(  # as the Slurm backend reads `scontrol show job`: ExitCode is 0 until the job ends
            job_id=str(record.job_id),
            state=state["state"],
            reason="" if state.get("reason") in (None, "None") else str(state["reason"]),  # as JobInfo says Slurm's None
            nodes=compress(state.get("nodes") or []),
            exit_code=int(state.get("exit_code", [0, 0])[0]),
            requeue_count=int(state.get("restarts", 0)),
            batch_host=str(state.get("batch_host") or "") if state.get("nodes") else "",
        )

    def cancel(self, job_id: str) -> None:
        number = native_id(str(job_id))
        if number is None:
            raise ClusterctlError(
                f"{job_id!r} is not a local job id (local jobs are {jobid.LOCAL_PREFIX}N)", ExitCode.USAGE
            )
        try:
            cancel_job(self.root, number)
        except ControlError as exc:
            raise ClusterctlError(f"cannot cancel job {display_id(number)}: {exc}", ExitCode.USAGE) from None

    def set_excluded(self, job_id: str, nodes: list[str]) -> None:
        number = native_id(str(job_id))
        try:
            if number is None:
                raise ControlError(f"{job_id!r} is not a local job id (local jobs are {jobid.LOCAL_PREFIX}N)")
            update_job(self.root, number, {"ExcNodeList": compress(nodes)})
        except ControlError as exc:
            raise ClusterctlError(f"cannot update job {display_id(job_id)}: {exc}", ExitCode.BACKEND_UNAVAILABLE) from None

    def signal(self, job_id: str, sig: str) -> None:
        number = native_id(str(job_id))
        try:
            if number is None:
                raise ControlError(f"{job_id!r} is not a local job id (local jobs are {jobid.LOCAL_PREFIX}N)")
            find(self.root, number)  # signal_job, as scancel does, says nothing about an unknown job
            signal_job(self.root, number, int(signal.Signals[f"SIG{sig}"]), batch=True)
        except (ControlError, KeyError) as exc:
            raise ClusterctlError(
                f"cannot signal job {display_id(job_id)} (state directory {self.root}): {exc}", ExitCode.BACKEND_UNAVAILABLE
            ) from None

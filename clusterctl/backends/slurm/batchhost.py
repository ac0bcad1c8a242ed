"""Slurm as the batch host asks it, from inside the job: how the job stands, the continuation, a requeue, a cancel.

The batch script's recovery step (runtime/recovery/nextattempt.py) and the
controller (an attempt stopped from outside) are Slurm clients too. They go
through commands.run, the one runner with its timeout, and cliquery's parser,
as every other Slurm call clusterctl makes; nothing on the node side runs
sbatch, scontrol or scancel itself. One job is asked at a time, with
`scontrol show job -o` (the local backend's scontrol emulates it field for
field). Calls made from inside a job run without the job's own SLURM_*
variables (clean_env): sbatch would otherwise take this job's node list and id
for the new one's. Standard library only: this runs on the batch host.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Literal

from clusterctl import envnames
from clusterctl.backends.base import JobInfo
from clusterctl.backends.slurm.cliquery import parse_scontrol_job
from clusterctl.backends.slurm.commands import run, slurm_reason
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.syntax import hostlist

TIMEOUT_S = 20.0  # one call from inside the job: the batch script waits on it
JOB_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_")
KEEP_ENV = ("SLURM_CONF",)  # the site's configuration, not the job's

# How Slurm is ending the job around us, as asked once a stop signal came (ending()).
SlurmEnd = Literal["running", "requeued", "preempted", "timeout", "cancelled"]


def clean_env(env: dict[str, str]) -> dict[str, str]:
    """The job's own SLURM_*/SBATCH_* variables would leak into a job submitted from inside it (its node list, its id),
    and so would the job it took over from (a grow-back job's CLUSTERCTL_TAKES_OVER)."""
    return {k: v for k, v in env.items()
            if k != envnames.TAKES_OVER and (k in KEEP_ENV or not k.startswith(JOB_ENV_PREFIXES))}


def job(job_id: str) -> JobInfo | None:
    """The job as `scontrol show job -o` says, or None when Slurm cannot say (forgotten, unreachable, no scontrol):
    the batch host goes on with what it knows rather than stop on a question."""
    try:
        out = run(["scontrol", "show", "job", "-o", job_id], timeout=TIMEOUT_S)
    except ClusterctlError:
        return None
    return parse_scontrol_job(out.stdout) if out.returncode == 0 else None


def ending(job_id: str, restart_count: int) -> SlurmEnd:
    """How Slurm is ending the job, once a stop signal came. A requeue (preemption with PreemptMode=REQUEUE,
    scontrol requeue) has already raised Restarts past this run's SLURM_RESTART_COUNT; a scancel leaves it and
    shows COMPLETING (measured on Slurm 22.05); a signal while still RUNNING is the pre-timeout signal or a
    preemption's warning."""
    info = job(job_id) if job_id else None
    if info is None:
        return "running"
    if info.requeue_count > restart_count:
        return "requeued"
    if info.state == "PREEMPTED":
        return "preempted"
    if info.state == "TIMEOUT" or info.reason == "TimeLimit":
        return "timeout"
    if info.state in ("COMPLETING", "CANCELLED"):
        return "cancelled"
    return "running"


def restart_count(env: dict[str, str]) -> int:
    """SLURM_RESTART_COUNT: unset on a job's first run, then 1, 2, ..."""
    with contextlib.suppress(ValueError):
        return int(env.get("SLURM_RESTART_COUNT") or 0)
    return 0


def submit_after(script: Path, after_job: str, exclude: list[str], env: dict[str, str],
                 extra_env: dict[str, str] | None = None) -> str:
    """The run's next job, to start once `after_job` has ended (or at once where `after_job` is "": an elastic
    job's full-size continuation, queued while the shrunk one trains), submitted from this process's working
    directory (the user's submit directory, or its --chdir, which sbatch hands on): the ranks' relative paths mean
    what they meant in the first job. `extra_env` goes to the new job's batch script. Raises ClusterctlError with
    Slurm's reason."""
    argv = ["sbatch", "--parsable", *([f"--dependency=afterany:{after_job}"] if after_job else [])]
    if exclude:
        argv.append(f"--exclude={hostlist.compress(exclude)}")
    out = run([*argv, str(script)], cwd=Path(os.getcwd()), env={**clean_env(env), **(extra_env or {})}, timeout=TIMEOUT_S)
    job_id = out.stdout.strip().split(";")[0]
    if out.returncode != 0 or not job_id.isdigit():
        raise ClusterctlError(f"sbatch failed: {slurm_reason(out.stderr or out.stdout)}", ExitCode.BACKEND_UNAVAILABLE)
    return job_id


def requeue_self(job_id: str, exclude: list[str]) -> str:
    """Requeue the job this process runs in, keeping `exclude` (every node the run avoids) out of its next run.

    Slurm answers the requeue by stopping the job (TERM to its processes): this process ignores TERM from here on,
    so that it still hands the batch shell its decision before KillWait ends. The exclusion can only be set once
    the job is requeued (Slurm refuses ExcNodeList on a running job, and takes it during the kill: measured on
    22.05). Raises ClusterctlError when the requeue is refused; returns a warning when only the exclusion was
    (the job then reruns where Slurm puts it, and its recovery step avoids the nodes as it can)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = run(["scontrol", "requeue", job_id], timeout=TIMEOUT_S)
    if out.returncode != 0:
        raise ClusterctlError(f"scontrol requeue {job_id} failed: {slurm_reason(out.stderr or out.stdout)}",
                              ExitCode.BACKEND_UNAVAILABLE)
    if not exclude:
        return ""
    try:
        out = run(["scontrol", "update", f"jobid={job_id}", f"ExcNodeList={hostlist.compress(exclude)}"], timeout=TIMEOUT_S)
    except ClusterctlError as exc:
        return f"the requeued job may run on {hostlist.compress(exclude)} again: {exc}"
    if out.returncode != 0:
        return f"the requeued job may run on {hostlist.compress(exclude)} again: {slurm_reason(out.stderr or out.stdout)}"
    return ""


def release(job_id: str, keep: list[str], env: dict[str, str]) -> tuple[str, dict[str, str]]:
    """Shrink this running job to `keep`: the other nodes go back to Slurm (an elastic shrink's lost ones), for an
    admin to repair and for another job to have (the run's queued full-size job too, once they are cleared). 22.05
    idles them at once and kills the job's steps there (measured on the test cluster) and writes no resize script:
    ("", the job's Slurm node variables for the batch shell to take) when done, else (Slurm's reason, {}) and the
    nodes stay in the job, unused."""
    try:
        out = run(["scontrol", "update", f"JobId={job_id}", f"NodeList={hostlist.compress(keep)}"], env=clean_env(env),
                  timeout=TIMEOUT_S)
    except ClusterctlError as exc:
        return str(exc), {}
    if out.returncode != 0:
        return slurm_reason(out.stderr or out.stdout), {}
    nodelist, count = hostlist.compress(keep), str(len(keep))
    return "", {"SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist, "SLURM_JOB_NUM_NODES": count, "SLURM_NNODES": count}


def signal_batch(job_id: str, name: str, env: dict[str, str]) -> str:
    """Send signal `name` (USR2) to another job's batch shell, as the pre-timeout signal comes: its ranks save,
    commit and stop. "" when sent, else Slurm's reason."""
    try:
        out = run(["scancel", f"--signal={name}", "--batch", job_id], env=clean_env(env), timeout=TIMEOUT_S)
    except ClusterctlError as exc:
        return str(exc)
    return "" if out.returncode == 0 else slurm_reason(out.stderr or out.stdout)


def cancel(job_id: str, env: dict[str, str]) -> None:
    """Cancel a job this one submitted; one that has ended already is left as it is."""
    with contextlib.suppress(ClusterctlError):
        run(["scancel", job_id], env=clean_env(env), timeout=TIMEOUT_S)

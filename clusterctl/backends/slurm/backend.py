"""The Slurm backend: submit with sbatch; ask, cancel and signal through the scheduler query.

Submitting stays `sbatch` whatever answers the questions (pyslurm 22.5's job
description drops `--switches` and `--signal=B:`). Questions and the other
actions go through `choose.choose_query()`: pyslurm where a matching release is
installed, else squeue/scontrol/scancel (see query.py). Every command has a
timeout: a hung slurmctld must not hang the user.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from clusterctl.backends.base import Backend, JobInfo, Submission
from clusterctl.backends.slurm.choose import choose_query
from clusterctl.backends.slurm.cliquery import parse_scontrol_job
from clusterctl.backends.slurm.commands import UNREACHABLE, failure_code, run, slurm_reason
from clusterctl.backends.slurm.query import SchedulerQuery
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import access
from clusterctl.syntax import hostlist

__all__ = ["UNREACHABLE", "SlurmBackend", "parse_scontrol_job", "slurm_reason"]


class SlurmBackend(Backend):
    name = "slurm"

    def __init__(self, query: SchedulerQuery | None = None) -> None:
        self._query = query

    @property
    def query(self) -> SchedulerQuery:
        """The scheduler query, chosen on first use (nothing is probed for a backend that only submits)."""
        if self._query is None:
            self._query = choose_query()
        return self._query

    def check(self) -> None:
        for tool in ("sbatch", "scontrol"):
            if shutil.which(tool) is None:
                run([tool])  # raises the clear message

    def submit(self, script: Path, workdir: Path, options: list[str] | None = None) -> Submission:
        umask, env = access.submission(script.parent, os.environ)
        out = run(["sbatch", "--parsable", *(options or []), str(script)], cwd=workdir, umask=umask, env=env)
        if out.returncode != 0:
            if failure_code(out.stderr) == ExitCode.BACKEND_UNAVAILABLE:
                raise ClusterctlError(f"cannot reach slurmctld, nothing was submitted: {slurm_reason(out.stderr)}",
                                      ExitCode.BACKEND_UNAVAILABLE)
            raise ClusterctlError(f"Slurm rejected the job: {slurm_reason(out.stderr)}", ExitCode.BAD_CONFIG)
        job_id = out.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise ClusterctlError(f"sbatch answered {out.stdout.strip()!r}, expected a job id", ExitCode.BUG)
        return Submission(job_id=job_id, backend=self.name)

    def info(self, job_id: str) -> JobInfo | None:
        return self.query.job(job_id)

    def info_many(self, job_ids: Sequence[str]) -> dict[str, JobInfo | None]:
        """One scheduler request for all of them; a job it no longer knows is None."""
        return self.query.jobs(job_ids)

    def cancel(self, job_id: str) -> None:
        self.query.cancel(job_id)

    def signal(self, job_id: str, sig: str) -> None:
        self.query.signal(job_id, sig)

    def set_excluded(self, job_id: str, nodes: list[str]) -> None:
        out = run(["scontrol", "update", f"jobid={job_id}", f"ExcNodeList={hostlist.compress(nodes)}"])
        if out.returncode != 0:
            raise ClusterctlError(f"scontrol update of job {job_id} refused: {slurm_reason(out.stderr or out.stdout)}",
                                  failure_code(out.stderr, ExitCode.USAGE))

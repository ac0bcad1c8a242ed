"""submitit's JobEnvironment inside a clusterctl rank: `submitit.JobEnvironment()` from the submitted function.

The rank's coordinates come from what the wrapper exported (RANK, LOCAL_RANK,
GROUP_RANK, WORLD_SIZE) rather than from srun's task ids, so they are the
plan's, also after a restart on other nodes. The runner sets
SUBMITIT_EXECUTOR=clusterctl, which is how submitit picks this environment.
"""

from __future__ import annotations

import os
import typing as tp

from submitit.core.job_environment import JobEnvironment

from clusterctl import envnames
from clusterctl.integrations.submitit.paths import RunPaths


class ClusterctlJobEnvironment(JobEnvironment):
    """Where a function submitted through the clusterctl executor runs: its rank, node and run."""

    _env: tp.ClassVar[dict[str, str]] = {
        "job_id": "SLURM_JOB_ID",
        "num_tasks": "WORLD_SIZE",
        "num_nodes": envnames.NODES,
        "node": "GROUP_RANK",
        "global_rank": "RANK",
        "local_rank": "LOCAL_RANK",
    }

    @property
    def paths(self) -> RunPaths:  # type: ignore[override]
        """The run's submitit files: named after the run, not the job (a continuation is another job)."""
        return RunPaths(os.environ[envnames.RUN_DIR], self.global_rank)

    @property
    def hostnames(self) -> list[str]:  # type: ignore[override]
        """The attempt's nodes in slot order (the batch script's hosts file)."""
        try:
            with open(os.environ[envnames.HOSTFILE], encoding="utf-8") as fh:
                return [line.strip() for line in fh if line.strip()]
        except (KeyError, OSError):
            return [self.hostname]

    @property
    def run_dir(self) -> str:
        return os.environ[envnames.RUN_DIR]

    @property
    def attempt(self) -> int:
        """The attempt number within the run: 2 and up after a restart or a continuation."""
        return int(os.environ.get(envnames.ATTEMPT, "0") or 0)

    def _requeue(self, countdown: int) -> None:
        """Never `scontrol requeue`: clusterctl's batch script continues the run after a pre-timeout stop."""

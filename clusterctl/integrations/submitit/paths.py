"""Where submitit's files live inside a clusterctl run: `<run>/submitit/`.

submitit names its pickles after the Slurm job id; a clusterctl run outlives
its jobs (a continuation is a new job), so here they are named after the run:
the submitted callable (replaced by its checkpoint at a pre-timeout stop) and
one result per rank. Ranks and the submitting process compute the same names
from the run directory alone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from submitit.core.utils import JobPaths

from clusterctl import rundir
from clusterctl.rundir import RunDir, runjson


class RunPaths(JobPaths):
    """submitit's JobPaths for one rank (`task_id`) of a clusterctl run."""

    def __init__(self, run_dir: Path | str, task_id: int | None = 0) -> None:
        super().__init__(Path(run_dir) / rundir.SUBMITIT, job_id=None, task_id=task_id)
        self.run_dir = Path(run_dir).expanduser().absolute()

    @property
    def submitted_pickle(self) -> Path:
        return self.folder / "submitted.pkl"

    @property
    def result_pickle(self) -> Path:
        return self.folder / f"rank-{self.task_id}.result.pkl"

    @property
    def submission_file(self) -> Path:
        return self.run_dir / rundir.SBATCH

    @property
    def stdout(self) -> Path:
        """The node log holding this rank's lines in the newest attempt (srun labels each line with the rank)."""
        return self._node_log()

    @property
    def stderr(self) -> Path:
        return self._node_log()  # srun writes both streams of a rank to its node's log

    def _node_log(self) -> Path:
        run = RunDir(self.run_dir)
        attempts = run.attempts()
        gpn = (runjson.read(run.path) or runjson.RunJson()).gpus_per_node or 1
        return rundir.node_log(run.attempt(attempts[-1] if attempts else 1), self.task_id // max(gpn, 1))

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.run_dir}, task_id={self.task_id})"


def write_atomic(path: Path, data: bytes) -> None:
    """Readers (the other side, another attempt) see the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_pickle(obj: Any, path: Path) -> None:
    """cloudpickle `obj` (a DelayedSubmission, or a ("success"|"error", value) outcome) into place."""
    import cloudpickle

    write_atomic(path, cloudpickle.dumps(obj))

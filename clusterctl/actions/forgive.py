"""A suspect cleared: elastic runs waiting to grow back may have the node again.

`clusterctl suspects --clear NODE` forgives a node for new submissions. An
elastic run that shrank queued its full-size job without the nodes it then
avoided (attempts.jsonl's `grow`), and gave those nodes back to Slurm
(runtime/recovery/nextattempt.release_lost). Here the queued job's excluded
nodes are brought up to date, so that Slurm may start it on the repaired
node; where Slurm refused to queue it at the shrink (no nodes enough but
the avoided ones), it is queued now, taking over from the shrunk job as the
shrink's own would. Its recovery step, reading the same clear
(suspects.forgiven), then uses the node too. Each change is another `grow`
event.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from clusterctl import envnames
from clusterctl.actions.requeue import submit_dir
from clusterctl.actions.runjobs import backend_of
from clusterctl.errors import ClusterctlError
from clusterctl.rundir import RUN_JSON, RunDir, history
from clusterctl.syntax import hostlist


@contextlib.contextmanager
def taking_over(job_id: str) -> Iterator[None]:
    """CLUSTERCTL_TAKES_OVER in the environment the job is submitted with (sbatch's --export=ALL hands it on), as
    the shrink's own submission sets it: the new job's recovery step stops the shrunk one and takes the run over."""
    before = os.environ.get(envnames.TAKES_OVER)
    os.environ[envnames.TAKES_OVER] = job_id
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(envnames.TAKES_OVER, None)
        else:
            os.environ[envnames.TAKES_OVER] = before


def widen_grow_jobs(root: Path, cleared: list[str], show: Callable[[str], None]) -> list[str]:
    """Every run under `root` whose queued full-size job leaves out a `cleared` node: that job's exclusion without
    it; where Slurm refused to queue that job at the shrink (too few nodes but the avoided ones), it is queued now.
    The runs changed, by name."""
    changed = []
    for path in sorted(p for p in root.iterdir() if p.is_dir()):
        if not (path / RUN_JSON).is_file():
            continue
        run = RunDir(path)
        told = history.read(run)
        back = [n for n in told.grow_exclude if n in cleared]
        waiting = told.grow_job is not None or (told.grow_refused and told.position == history.RUNNING)
        if told.stopped or not back or not waiting or told.current is None:
            continue
        keep = [n for n in told.grow_exclude if n not in cleared]
        try:
            backend = backend_of(run)
            if told.grow_job:
                backend.set_excluded(told.grow_job, keep)
                job, how = told.grow_job, "may now run on"
            else:
                options = [f"--exclude={hostlist.compress(keep)}"] if keep else []
                with taking_over(told.current.job_id):
                    job, how = backend.submit(run.sbatch, submit_dir(run), options).job_id, "is queued now and may run on"
        except ClusterctlError as exc:
            show(f"run {path.name}: its full-size job to grow back into still leaves out {', '.join(back)}: {exc}")
            continue
        try:
            history.append(run, history.EVENT_GROW, attempt=told.current.number, job_id=told.current.job_id,
                           next_job=job, exclude=keep, by="clusterctl suspects --clear",
                           reason=f"{', '.join(back)} cleared: the full-size job queued to grow back may run there")
        except OSError as exc:  # another user's run in a shared runs root: the job changed, its history not
            show(f"run {path.name}: {exc.strerror or exc} writing its history (job {job} was changed)")
        show(f"run {path.name}: its full-size job {backend.display_id(job)}, to grow back into, {how} {', '.join(back)}")
        changed.append(path.name)
    return changed

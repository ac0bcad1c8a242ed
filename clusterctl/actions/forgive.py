"""A suspect cleared: elastic runs waiting to grow back may have the node again.

`clusterctl suspects --clear NODE` forgives a node for new submissions. An
elastic run that shrank queued its full-size job without the nodes it then
avoided (attempts.jsonl's `grow`), and gave those nodes back to Slurm
(runtime/recovery/nextattempt.release_lost). Here the queued job's excluded
nodes are brought up to date, so that Slurm may start it on the repaired
node; its recovery step, reading the same clear (suspects.forgiven), then
uses the node too. The change is recorded as another `grow` event.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from clusterctl.actions.runjobs import backend_of
from clusterctl.errors import ClusterctlError
from clusterctl.rundir import RUN_JSON, RunDir, history


def widen_grow_jobs(root: Path, cleared: list[str], show: Callable[[str], None]) -> list[str]:
    """Every run under `root` whose queued full-size job leaves out a `cleared` node: that job's exclusion without
    it. The runs widened, by name."""
    widened = []
    for path in sorted(p for p in root.iterdir() if p.is_dir()):
        if not (path / RUN_JSON).is_file():
            continue
        run = RunDir(path)
        told = history.read(run)
        back = [n for n in told.grow_exclude if n in cleared]
        if not told.grow_job or told.stopped or not back:
            continue
        keep = [n for n in told.grow_exclude if n not in cleared]
        try:
            backend = backend_of(run)
            backend.set_excluded(told.grow_job, keep)
        except ClusterctlError as exc:
            show(f"run {path.name}: its full-size job {told.grow_job}, queued to grow back, still leaves out"
                 f" {', '.join(back)}: {exc}")
            continue
        current = told.current
        history.append(run, history.EVENT_GROW, attempt=current.number if current else 0,
                       job_id=current.job_id if current else "", next_job=told.grow_job, exclude=keep,
                       by="clusterctl suspects --clear",
                       reason=f"{', '.join(back)} cleared: the full-size job queued to grow back may run there")
        show(f"run {path.name}: its full-size job {backend.display_id(told.grow_job)}, queued to grow back, may now"
             f" run on {', '.join(back)}")
        widened.append(path.name)
    return widened

"""`clusterctl cancel`: stop a whole run — its running job, any pending continuation, every future restart.

The run's own marker (rundir.CANCEL) is what makes a cancel final: the batch
script's recovery step reads it before it starts an attempt and before it
submits a continuation, so a job that is already deciding cannot bring the
run back. A run with no job left pending or running has already ended: the
cancel says how it ended and changes nothing (its history stays as it was).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from clusterctl.actions.runjobs import Report, active_jobs, backend_of, stop_jobs
from clusterctl.backends import Backend
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import CANCEL, RunDir, history, secretenv, write_json_atomic
from clusterctl.views.state import derive_one


def cancel_run(run: RunDir, save: bool, timeout: float, show: Callable[[str], None], by: str = "clusterctl cancel") -> Report:
    """Stop the whole run; refused (nothing written) when no job of the run is pending or running."""
    backend = backend_of(run)
    jobs = active_jobs(run, backend)
    if not jobs:
        raise ClusterctlError(f"run {run.path.name} has already ended ({_how_it_ended(run, backend)}): nothing to cancel; its"
                              " history is left as it is", ExitCode.USAGE)
    write_json_atomic(run.path / CANCEL, {"time": time.time(), "save": save, "by": by})
    history.append(run, history.EVENT_CANCEL, by=by, save=save)
    report = Report(run.path.name)
    stop_jobs(run, backend, save, timeout, show, report, jobs)
    secretenv.remove(run.path)  # a job that never started records no stop of its own
    return report


def _how_it_ended(run: RunDir, backend: Backend) -> str:
    st = derive_one(run, lambda _name: backend)
    return st.state + (f": {st.reason}" if st.reason else "")

"""`submit --wait`: follow a run until it ends, through restarts and continuation jobs, showing what changes.

Each poll asks the scheduler about the one job the run directory cannot settle
and derives the run's state as `status` does (runstate.derive), so both tell
the same story: the pending reason, the verdict with its culprit, each
decision to restart or continue, and the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clusterctl import rundir
from clusterctl.backends import Backend
from clusterctl.cli.status_view import status_line
from clusterctl.rundir import RunDir
from clusterctl.runstate import COMPLETED, FINAL, RunState, derive, wanted_job


@dataclass(frozen=True)
class Outcome:
    state: RunState
    exit_code: int
    summary: str


def _decisions(run: RunDir) -> list[dict[str, Any]]:
    return [e for e in run.events() if e.get("event") == rundir.EVENT_NEXT and e.get("attempt")]


def exit_code(st: RunState) -> int:
    """What `submit --wait` exits with: 0 for a completed run, else the run's recorded code (1 when none was)."""
    if st.state == COMPLETED:
        return 0
    return st.exit_code if isinstance(st.exit_code, int) and st.exit_code != 0 else 1


def follow(backend: Backend, run: RunDir, show: Callable[[str], None], every_s: float = 1.0) -> Outcome:
    """Poll until the run reaches a final state; `show` gets each decision and each changed state line."""
    shown = ""
    told = len(_decisions(run))  # decisions made before we started following are old news
    while True:
        job = wanted_job(run)
        st = derive(run, backend.info_many([job]) if job else {})
        for event in _decisions(run)[told:]:  # why the next attempt begins, or why the run stops
            told += 1
            show(f"attempt {event.get('attempt')} ended with exit {event.get('exit')}: {event.get('reason')}")
        line = status_line(st)
        if line != shown:
            show(line)
            shown = line
        if st.state in FINAL:
            break
        time.sleep(every_s)
    code = exit_code(st)
    summary = f"run {st.run} {st.state} in job {st.job_id or '-'} with exit code {code}"
    if st.state != COMPLETED and st.reason:
        summary += f": {st.reason}"
    return Outcome(st, code, summary)

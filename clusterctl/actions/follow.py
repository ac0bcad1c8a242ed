"""`submit --wait`: follow a run until it ends, through restarts and continuation jobs, showing what changes.

Each poll derives the run's state as `status` does (runstate.derive, here or
on a login node), so both tell the same story: the pending reason, the
verdict with its culprit, each decision to restart or continue, and the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from clusterctl.backends import Backend
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir
from clusterctl.views.state import CANCELLED, COMPLETED, FINAL, RunState, derive_one
from clusterctl.views.statetext import status_line


@dataclass(frozen=True)
class Outcome:
    state: RunState
    exit_code: int
    summary: str


def exit_code(st: RunState) -> int:
    """What `submit --wait` exits with: 0 for a completed run, else the run's code as its state gives it (89 for a
    cancel, views/state.py); 89 too for a cancelled run a login node's older clusterctl shows without one; else 1."""
    if st.state == COMPLETED:
        return 0
    if isinstance(st.exit_code, int) and st.exit_code != 0:
        return st.exit_code
    return int(ExitCode.CANCELLED) if st.state == CANCELLED else int(ExitCode.BUG)


def local_state(backend: Backend, run: RunDir) -> Callable[[], RunState]:
    """The run's state here: one scheduler question per poll, about the one job that matters."""

    return lambda: derive_one(run, lambda _name: backend)


def follow(poll: Callable[[], RunState], show: Callable[[str], None], every_s: float = 1.0) -> Outcome:
    """Poll until the run reaches a final state; `show` gets each decision and each changed state line."""
    shown = ""
    told: set[int] | None = None  # attempts whose decision was shown (those decided before we began are old news)
    while True:
        st = poll()
        decided = [a for a in st.attempts if a.next]
        if told is None:
            told = {a.attempt for a in decided}
        for a in decided:  # why the next attempt begins, or why the run stops
            if a.attempt not in told:
                told.add(a.attempt)
                show(f"attempt {a.attempt} ended with exit {a.exit_code}: {a.next_reason}")
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

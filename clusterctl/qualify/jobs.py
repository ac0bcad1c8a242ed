"""Running one of the ladder's jobs: submit a variant of the spec, act on it meanwhile, wait for its end.

Every job goes through the same path a user's does (load_for_submit, submit_job,
the state derivation), under the ladder's own runs root, so its run
directory, verdicts and report are the usual ones.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterctl import rundir
from clusterctl.actions.follow import follow, local_state
from clusterctl.actions.submit import load_for_submit, submit_job
from clusterctl.backends import get_backend
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.plan.job import PlannedJob
from clusterctl.qualify import faultdrill
from clusterctl.rundir import RunDir
from clusterctl.rundir import metrics as metricsfile
from clusterctl.views.state import RunState


@dataclass
class JobRun:
    """A finished job of the ladder."""

    name: str
    job: PlannedJob
    run: RunDir
    state: RunState
    wall_s: float
    during: dict[str, Any] = field(default_factory=dict)  # what the action taken meanwhile reported (a drill's JSON)

    @property
    def completed(self) -> bool:
        return self.state.state == "completed"

    def metrics(self, attempt: int | None = None) -> list[dict[str, Any]]:
        """Rank 0's metrics records of one attempt (all attempts in order by default)."""
        numbers = [attempt] if attempt is not None else self.run.attempts()
        return [record for n in numbers for record in metricsfile.read_all(self.run.attempt(n) / rundir.METRICS)]

    def why(self) -> str:
        """A failed job in one line: state, reason, where to look."""
        return f"{self.name}: {self.state.state} (exit {self.state.exit_code}): {self.state.reason or 'no reason given'} [{self.run.path}]"


def drill(run: RunDir, timeout_s: float = 300, **fault: Any) -> dict[str, Any]:
    """A fault drill on the run (`kill=1`, `pre_timeout=True`: faultdrill.choose_fault's arguments), in this process.

    The faults still come from outside the program under test (the injector runs as its own process); the
    drill's report is `clusterctl drill --json`'s, with `exit` as that command's exit code: 0 passed, 3 missed,
    or the error's code with `error` when the drill could not be run.
    """
    quiet: Callable[[str], None] = lambda _line: None
    try:
        kind, target, factor, period = faultdrill.choose_fault(**fault)
        report = faultdrill.run_drill(run, kind, target, factor, timeout_s, show=quiet, warn=quiet, period=period)
    except ClusterctlError as exc:
        return {"error": exc.message, "exit": int(exc.exit_code)}
    except Exception:  # noqa: BLE001 - a bug in the drill: the rung reports it, as it did the command's crash
        return {"error": traceback.format_exc().strip()[-2000:], "exit": int(ExitCode.BUG)}
    report.pop("what", None)
    report["exit"] = 0 if faultdrill.passed(report) else int(ExitCode.DRILL_MISSED)
    return report


def past_step(run: RunDir, step: int, timeout_s: float = 300) -> bool:
    """Wait until the run's first attempt has trained beyond `step` (an action needs a checkpoint behind it)."""
    path = run.attempt(1) / rundir.METRICS
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with metricsfile.MetricsFile(path) as records:
            last = records.last()
        if last is not None and last["step"] > step:
            return True
        time.sleep(0.2)
    return False


class Runner:
    """Submits the ladder's jobs of one spec on one backend, into one runs root."""

    def __init__(self, spec: Path, site: str | None, backend: str | None, runs_root: Path, show: Callable[[str], None],
                 sets: list[str] | None = None) -> None:
        self.spec, self.site, self.backend, self.runs_root, self.show = spec, site, backend, runs_root, show
        self.sets = list(sets or [])  # the user's --set, under each rung's own overrides

    def load(self, overrides: list[str]) -> PlannedJob:
        return load_for_submit(self.spec, [*self.sets, *overrides, f"runs_root={json.dumps(str(self.runs_root))}"], self.site)

    def run(self, name: str, overrides: list[str], during: Callable[[RunDir], dict[str, Any]] | None = None) -> JobRun:
        job = self.load([*overrides, f"name=q-{name}"])
        began = time.monotonic()
        done = submit_job(job, self.backend)
        self.show(f"  job {done.display_id}: {job.plan.world_size} ranks on {job.plan.nodes} node(s), {done.run.path.name}")
        acted: dict[str, Any] = {}
        helper = None
        if during is not None:
            helper = threading.Thread(target=lambda: acted.update(during(done.run)), daemon=True)
            helper.start()
        outcome = follow(local_state(get_backend(done.backend), done.run), lambda line: self.show(f"    {line}"), every_s=1.0)
        if helper is not None:
            helper.join(timeout=60)
        return JobRun(name, job, done.run, outcome.state, time.monotonic() - began, acted)

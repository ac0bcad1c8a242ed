"""Running one of the ladder's jobs: submit a variant of the spec, act on it meanwhile, wait for its end.

Every job goes through the same path a user's does (load_job, submit_job,
the state derivation), under the ladder's own runs root, so its run
directory, verdicts and report are the usual ones.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterctl import rundir
from clusterctl.backends import get_backend
from clusterctl.actions.follow import follow, local_state
from clusterctl.plan.job import Job, load_job
from clusterctl.rundir import RunDir
from clusterctl.views.state import RunState
from clusterctl.actions.submit import submit_job


@dataclass
class JobRun:
    """A finished job of the ladder."""

    name: str
    job: Job
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
        records = []
        for n in numbers:
            path = self.run.attempt(n) / rundir.METRICS
            if path.exists():
                for line in path.read_text().splitlines():
                    try:
                        records.append(json.loads(line))
                    except ValueError:
                        continue
        return records

    def why(self) -> str:
        """A failed job in one line: state, reason, where to look."""
        return f"{self.name}: {self.state.state} (exit {self.state.exit_code}): {self.state.reason or 'no reason given'} [{self.run.path}]"


def clusterctl_argv(*args: str) -> list[str]:
    """This clusterctl as a subprocess (drills run from outside the program under test)."""
    return [sys.executable, "-c", "from clusterctl.cli import main; main()", *args]


def drill(run: RunDir, *args: str, timeout_s: float = 300) -> dict[str, Any]:
    done = subprocess.run(clusterctl_argv("drill", str(run.path), *args, "--json", "--timeout", str(int(timeout_s))),
                          capture_output=True, text=True, timeout=timeout_s + 60, check=False)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        report = {"error": (done.stderr or done.stdout).strip()[-2000:]}
    report["exit"] = done.returncode
    return report


def past_step(run: RunDir, step: int, timeout_s: float = 300) -> bool:
    """Wait until the run's first attempt has trained beyond `step` (an action needs a checkpoint behind it)."""
    path = run.attempt(1) / rundir.METRICS
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            lines = path.read_text().strip().splitlines()
            try:
                if lines and json.loads(lines[-1])["step"] > step:
                    return True
            except (ValueError, KeyError):
                pass
        time.sleep(0.2)
    return False


class Runner:
    """Submits the ladder's jobs of one spec on one backend, into one runs root."""

    def __init__(self, spec: Path, site: str | None, backend: str | None, runs_root: Path, show: Callable[[str], None]) -> None:
        self.spec, self.site, self.backend, self.runs_root, self.show = spec, site, backend, runs_root, show

    def load(self, overrides: list[str]) -> Job:
        return load_job(self.spec, [*overrides, f"runs_root={json.dumps(str(self.runs_root))}"], self.site)

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

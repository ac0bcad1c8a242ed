"""`clusterctl submit`: one gang allocation for the whole job."""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.text import Text

from clusterctl import hostlist, rundir
from clusterctl.backends import BACKENDS, get_backend
from clusterctl.cli.app import out_console
from clusterctl.cli.options import SetOpt, SiteOpt, SpecArg
from clusterctl.job import load_job
from clusterctl.submit import SuspectChoice, submit_job
from clusterctl.units import format_duration
from clusterctl.cli.wait import follow


def _when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(epoch))


def print_suspects(console: Console, choice: SuspectChoice, *, warn: bool, now: float | None = None) -> None:
    """One line per suspect left out (node, reason, run, how long ago, until when), or why none were."""
    now = time.time() if now is None else now
    for s in choice.excluded:
        console.print(
            f"excluding suspect node {s.node}: {s.reason} (code {s.code}) in run {s.run},"
            f" {format_duration(max(0.0, now - s.time))} ago; avoided until {_when(choice.until(s))}"
        )
    if choice.kept:
        names = hostlist.compress([s.node for s in choice.kept])
        text = f"suspect nodes {names} are not excluded: {choice.why_kept}"
        if warn:
            console.print(Text.assemble(("warning: ", "yellow"), text + "; the job may run on them"))
        else:
            console.print(f"note: {text}")


def register(app: typer.Typer) -> None:
    @app.command("submit")
    def submit(
        spec: SpecArg,
        backend: Annotated[
            Optional[str], typer.Option("--backend", "-b", help=f"one of {', '.join(BACKENDS)} (default: local for the local site, else slurm)")
        ] = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="create the run directory but submit nothing")] = False,
        wait: Annotated[bool, typer.Option("--wait", help="follow the job until it ends; exit with its code")] = False,
        site: SiteOpt = None,
        set_: SetOpt = None,
    ) -> None:
        """Validate, render into a new run directory, and submit."""
        job = load_job(spec, set_ or [], site)
        done = submit_job(job, backend, dry_run=dry_run)
        console = out_console()
        print_suspects(console, done.suspects, warn=job.spec.topology.avoid_suspects)
        if done.job_id is None:
            console.print(f"dry run: nothing submitted; run directory {done.run.path}")
            console.print(f"the batch script is {done.run.sbatch}")
            return
        console.print(f"submitted job {done.display_id} ({done.backend}): {job.plan.world_size} ranks on {job.plan.nodes} nodes")
        console.print(f"run directory: {done.run.path}")
        console.print(f"logs: {done.run.path}/slurm-{done.job_id}.out and {done.run.path}/{rundir.ATTEMPT_PREFIX}N/{rundir.LOGS}/")
        for warning in done.warnings:
            console.print(Text.assemble(("warning: ", "yellow"), warning))
        if wait:
            outcome = follow(get_backend(done.backend), done.run, lambda line: console.print(line))
            console.print(outcome.summary)
            raise typer.Exit(outcome.exit_code)

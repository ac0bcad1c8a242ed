"""`clusterctl submit`: one gang allocation for the whole job."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.text import Text

from clusterctl import rundir
from clusterctl.actions.follow import follow, local_state
from clusterctl.actions.submit import Submitted, local_suspects, remote_command_warnings, submit_job
from clusterctl.backends import BACKENDS, get_backend
from clusterctl.cli.app import err_console, out_console
from clusterctl.cli.options import AllowOomOpt, JsonOpt, SetOpt, SiteOpt, SpecArg, overrides
from clusterctl.cli.remote_opts import RemoteOpt, remote_target
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.plan.job import JobConfig, PlannedJob, plan_job, read_job
from clusterctl.plan.avoidance import SuspectChoice
from clusterctl.remote.submit import login_of, submit_remote
from clusterctl.syntax import hostlist
from clusterctl.syntax.units import format_duration
from clusterctl.views.state import RunState


def spare_note(spares: int) -> str:
    """What the allocation holds beyond the ranks' nodes: `, plus 1 spare node`."""
    return f", plus {spares} spare node{'s' if spares != 1 else ''}" if spares else ""


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
        wait: Annotated[bool, typer.Option("--wait", "--follow", "--watch", help="follow the job until it ends; exit with its code")] = False,
        site: SiteOpt = None,
        set_: SetOpt = None,
        allow_oom: AllowOomOpt = False,
        as_json: JsonOpt = False,
        remote: RemoteOpt = None,
        code: Annotated[Optional[Path], typer.Option(
            "--code", help="with --remote: ship this git work tree (default: the spec's) as the ranks' working directory")] = None,
        code_on_cluster: Annotated[Optional[str], typer.Option(
            "--code-on-cluster", metavar="PATH", help="with --remote: the ranks run in this existing directory instead")] = None,
    ) -> None:
        """Validate, render into a new run directory, and submit."""
        config = read_job(spec, overrides(set_, allow_oom), site)
        console = out_console()
        there = login_of(config, remote_target(remote), backend)
        if there is not None:
            _submit_remote(config, *there, backend, code, code_on_cluster, dry_run, wait, err_console if as_json else console,
                           as_json)
            return
        if code is not None or code_on_cluster is not None:
            raise ClusterctlError("--code and --code-on-cluster go with --remote (here the ranks run where you submit from)",
                                  ExitCode.USAGE)
        job = plan_job(config, local_suspects(config))  # planned once, the runs root's suspect nodes left out
        done = submit_job(job, backend, dry_run=dry_run)
        if as_json:
            print(json.dumps(_submitted_json(job, done, str(done.run.path)), indent=1), flush=True)
            console = err_console  # --wait's progress, off the JSON
        else:
            _say_submitted(console, job, done)
        if wait and done.job_id is not None:
            outcome = follow(local_state(get_backend(done.backend), done.run), lambda line: console.print(line))
            console.print(outcome.summary)
            raise typer.Exit(outcome.exit_code)


def _submitted_json(job: PlannedJob, done: Any, run: str, **more: object) -> dict[str, object]:
    """`submit --json`, here or on a login node (`done`: what either submission returned)."""
    return {"run": run, **more, "job_id": done.display_id, "backend": done.backend, "dry_run": done.job_id is None,
            "ranks": job.plan.world_size, "nodes": job.plan.nodes, "spares": job.spec.spares,
            "excluded_suspects": [s.node for s in done.suspects.excluded], "warnings": list(done.warnings)}


def print_warnings(console: Console, warnings: list[str] | tuple[str, ...]) -> None:
    for warning in warnings:
        console.print(Text.assemble(("warning: ", "yellow"), warning))


def _say_submitted(console: Console, job: PlannedJob, done: Submitted) -> None:
    print_suspects(console, done.suspects, warn=job.spec.topology.avoid_suspects)
    if done.job_id is None:
        console.print(f"dry run: nothing submitted; run directory {done.run.path}")
        console.print(f"the batch script is {done.run.sbatch}")
        print_warnings(console, done.warnings)
        return
    console.print(f"submitted job {done.display_id} ({done.backend}): {job.plan.world_size} ranks on {job.plan.nodes}"
                  f" nodes{spare_note(job.spec.spares)}")
    console.print(f"run directory: {done.run.path}")
    console.print(f"logs: {done.run.path}/slurm-{done.job_id}.out and {done.run.path}/{rundir.ATTEMPT_PREFIX}N/{rundir.LOGS}/")
    print_warnings(console, done.warnings)


def _submit_remote(config: JobConfig, host: str, command: str | None, transport: str, backend: str | None, code: Path | None,
                   code_on_cluster: str | None, dry_run: bool, wait: bool, console: Console, as_json: bool = False) -> None:
    """Render here, ship the run (and the code), submit on the login node; --wait follows it there."""
    console.print(f"connecting to {host} ...")
    said = remote_command_warnings(config, host, None if code_on_cluster else (code or config.spec_path.parent))
    done = submit_remote(config, host, command, transport, backend, code, code_on_cluster, dry_run)
    done = replace(done, warnings=[*said, *done.warnings])
    job = done.job
    with done.remote as link:
        where = f"{link.host}:{done.run_path}"
        if as_json:
            print(json.dumps(_submitted_json(job, done, done.run_path, host=link.host, workdir=str(done.workdir)), indent=1),
                  flush=True)
        print_suspects(console, done.suspects, warn=job.spec.topology.avoid_suspects)
        if done.job_id is None:
            console.print(f"dry run: nothing submitted; run directory {where}")
            print_warnings(console, done.warnings)
            return
        console.print(f"submitted job {done.display_id} ({done.backend}) on {link.host}: {job.plan.world_size} ranks"
                      f" on {job.plan.nodes} nodes{spare_note(job.spec.spares)}")
        console.print(f"run directory: {where} (the ranks run in {done.workdir})")
        print_warnings(console, done.warnings)
        if wait:
            poll = lambda: RunState.from_dict(link.json(["status", done.run_path, "--json"]))  # noqa: E731
            outcome = follow(poll, lambda line: console.print(line), every_s=2.0)
            console.print(outcome.summary)
            raise typer.Exit(outcome.exit_code)

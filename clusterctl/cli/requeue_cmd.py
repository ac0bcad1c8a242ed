"""`clusterctl requeue RUN`: continue a run from its latest committed checkpoint in a new job, by hand."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from clusterctl.actions.requeue import requeue_run
from clusterctl.cli.app import err_console, out_console
from clusterctl.cli.cancel_cmd import TimeoutOpt, print_jobs
from clusterctl.cli.options import JsonOpt
from clusterctl.cli.remote_opts import RemoteOpt, remote_target, run_there
from clusterctl.cli.runarg import RootOpt, RunArg, resolve_run


def register(app: typer.Typer) -> None:
    @app.command("requeue")
    def requeue(
        ctx: typer.Context,
        run: RunArg,
        exclude: Annotated[
            Optional[list[str]], typer.Option("--exclude", "-x", metavar="NODE", help="also avoid these nodes (repeatable; hostlists)")
        ] = None,
        keep_culprits: Annotated[
            bool, typer.Option("--keep-culprits", help="do not exclude the nodes the latest verdict blamed")
        ] = False,
        set_: Annotated[Optional[list[str]], typer.Option(
            "--set", "-s", metavar="FIELD=VALUE",
            help="change the run's spec: --set parallel.dp=2 (data parallel only; repeatable)")] = None,
        timeout: TimeoutOpt = 900.0,
        as_json: JsonOpt = False,
        root: RootOpt = None,
        remote: RemoteOpt = None,
    ) -> None:
        """Continue the run from its latest committed checkpoint in a new job.

        A pending job is cancelled, a running one saves and stops first; the
        nodes of the latest verdict's culprits are excluded unless told
        otherwise. --set may change the data-parallel size (the checkpoint is
        resharded on load); tp, pp, cp and ep changes are refused.
        """
        if where := remote_target(remote):
            run_there(where, ctx)
        target = resolve_run(run, root)
        report = requeue_run(target, exclude or [], keep_culprits, set_ or [], timeout, lambda line: err_console.print(line))
        if print_jobs(report, as_json):
            resume = f"step {report.resume_step}" if report.resume_step is not None else "the start (no committed checkpoint)"
            excluded = f", excluding {', '.join(report.exclude)}" if report.exclude else ""
            out_console().print(f"run {report.run} continues as job {report.submitted}{excluded}; it resumes at {resume}")

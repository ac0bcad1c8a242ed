"""`clusterctl cancel RUN` and `clusterctl requeue RUN`: stop a whole run, or continue it by hand."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from clusterctl.cli.app import err_console, out_console
from clusterctl.cli.options import JsonOpt, SetOpt
from clusterctl.cli.remote_opts import RemoteOpt, remote_target, run_there
from clusterctl.cli.runarg import resolve_run
from clusterctl.runcontrol import Report, cancel_run, requeue_run

RunArg = Annotated[str, typer.Argument(help="run directory, a run id under ./runs, or a job id of the run", show_default=False)]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", help="seconds a running job gets to save and stop before it is cancelled")
]


def _print(report: Report, as_json: bool, what: str) -> None:
    if as_json:
        print(json.dumps(report.as_dict(), indent=1, sort_keys=True))
        return
    console = out_console()
    for note in report.notes:
        console.print(f"note: {note}")
    if report.stopped:
        console.print(f"saved and stopped: job {', '.join(report.stopped)}")
    if report.cancelled:
        console.print(f"cancelled: job {', '.join(report.cancelled)}")
    if what == "cancel":
        if not report.stopped and not report.cancelled:
            console.print("no job of the run was pending or running")
        console.print(f"run {report.run} is stopped: no attempt starts and nothing continues it"
                      " (clusterctl requeue continues it from its latest committed checkpoint)")
        return
    resume = f"step {report.resume_step}" if report.resume_step is not None else "the start (no committed checkpoint)"
    excluded = f", excluding {', '.join(report.exclude)}" if report.exclude else ""
    console.print(f"run {report.run} continues as job {report.submitted}{excluded}; it resumes at {resume}")


def register(app: typer.Typer) -> None:
    @app.command("cancel")
    def cancel(
        ctx: typer.Context,
        run: RunArg,
        save: Annotated[bool, typer.Option("--save", help="let a running job save a checkpoint first")] = False,
        timeout: TimeoutOpt = 900.0,
        as_json: JsonOpt = False,
        remote: RemoteOpt = None,
    ) -> None:
        """Stop the whole run: its running job, any pending continuation, every future restart."""
        if where := remote_target(remote):
            run_there(where, ctx)
        target = resolve_run(run)
        report = cancel_run(target, save, timeout, lambda line: err_console.print(line))
        _print(report, as_json, "cancel")

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
        set_: SetOpt = None,
        timeout: TimeoutOpt = 900.0,
        as_json: JsonOpt = False,
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
        target = resolve_run(run)
        report = requeue_run(target, exclude or [], keep_culprits, set_ or [], timeout, lambda line: err_console.print(line))
        _print(report, as_json, "requeue")

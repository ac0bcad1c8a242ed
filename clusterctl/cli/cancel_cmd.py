"""`clusterctl cancel RUN`: stop a whole run — its running job, any pending continuation, every future restart."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from clusterctl.actions.cancel import cancel_run
from clusterctl.actions.runjobs import Report
from clusterctl.cli.app import err_console, out_console
from clusterctl.cli.options import JsonOpt
from clusterctl.cli.remote_opts import RemoteOpt, remote_target, run_there
from clusterctl.cli.runarg import RootOpt, RunArg, resolve_run

TimeoutOpt = Annotated[
    float, typer.Option("--timeout", help="seconds a running job gets to save and stop before it is cancelled")
]


def print_jobs(report: Report, as_json: bool) -> bool:
    """The jobs a cancel or requeue stopped (JSON: the whole report); False when JSON was printed."""
    if as_json:
        print(json.dumps(report.as_dict(), indent=1, sort_keys=True))
        return False
    console = out_console()
    for note in report.notes:
        console.print(f"note: {note}")
    if report.stopped:
        console.print(f"saved and stopped: job {', '.join(report.stopped)}")
    if report.cancelled:
        console.print(f"cancelled: job {', '.join(report.cancelled)}")
    return True


def register(app: typer.Typer) -> None:
    @app.command("cancel")
    def cancel(
        ctx: typer.Context,
        run: RunArg,
        save: Annotated[bool, typer.Option("--save", help="let a running job save a checkpoint first")] = False,
        timeout: TimeoutOpt = 900.0,
        as_json: JsonOpt = False,
        root: RootOpt = None,
        remote: RemoteOpt = None,
    ) -> None:
        """Stop the whole run: its running job, any pending continuation, every future restart.

        A run that has already ended is left as it is (exit 2, nothing written).
        """
        if where := remote_target(remote):
            run_there(where, ctx)
        target = resolve_run(run, root)
        report = cancel_run(target, save, timeout, lambda line: err_console.print(line))
        if print_jobs(report, as_json):
            out_console().print(f"run {report.run} is stopped: no attempt starts and nothing continues it"
                                " (clusterctl requeue continues it from its latest committed checkpoint)")

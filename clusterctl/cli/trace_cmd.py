"""`clusterctl trace RUN`: the run's timeline as a Chrome trace for ui.perfetto.dev or chrome://tracing."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from clusterctl import rundir
from clusterctl.cli.app import err_console
from clusterctl.cli.remote_opts import RemoteOpt, remote_target, run_there
from clusterctl.cli.runarg import RootOpt, RunArg, resolve_run
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.views.chrometrace import Summary, build_trace, write_trace, write_trace_file
from clusterctl.views.tracewindow import TRACE_BYTES


def _summary_line(summary: Summary, attempts: list[int], where: str) -> str:
    which = f"attempt {attempts[0]}" if len(attempts) == 1 else f"{len(attempts)} attempts"
    line = (
        f"trace: {summary.events:,} events, {len(summary.ranks)} ranks, {len(summary.hosts)} nodes, {which}, "
        f"span {summary.span_s:.1f} s -> {where}"
    )
    if summary.windows:
        shown = ", ".join(f"attempt {n}: its last {(size - start) / 1e6:,.0f} of {size / 1e6:,.0f} MB"
                          for n, (start, size) in sorted(summary.windows.items()))
        line += (f"\ntrace: phases and steps only from the end of each large timeline ({shown}); deaths, lost nodes"
                 " and verdicts from all of it; --all for everything")
    return line


def register(app: typer.Typer) -> None:
    @app.command("trace")
    def trace(
        ctx: typer.Context,
        run: RunArg,
        attempt: Annotated[
            Optional[int], typer.Option("--attempt", "-a", help="only this attempt (default: every attempt on one time axis)")
        ] = None,
        output: Annotated[Optional[str], typer.Option(
            "--output", "-o", help="where to write the trace JSON; - for stdout (default: RUN/trace.json, as report writes"
            " RUN/report; RUN/trace-attempt-N.json with --attempt)")] = None,
        steps: Annotated[bool, typer.Option("--steps/--no-steps", help="enclose each step's phases in a `step N` slice")] = True,
        gpu: Annotated[bool, typer.Option("--gpu/--no-gpu", help="GPU samples as counter tracks")] = True,
        whole: Annotated[bool, typer.Option("--all", help="every line of a timeline too large to trace whole (by default,"
                                            f" past {TRACE_BYTES >> 20} MB, each attempt's last part: the minutes before its end)")] = False,
        root: RootOpt = None,
        remote: RemoteOpt = None,
    ) -> None:
        """Write the run's phases, deaths, verdicts and restarts as a Chrome trace (JSON).

        One process per node of each attempt, one thread per rank; open the file in
        https://ui.perfetto.dev or chrome://tracing.
        """
        if where := remote_target(remote):
            run_there(where, ctx)  # `-o -` brings the trace here
        target = resolve_run(run, root)
        built = build_trace(target, attempt, steps=steps, gpu=gpu, whole=whole)
        attempts = [a.number for a in built.attempts]
        if output is None:  # in the run directory, as the report goes
            output = str(target.path / (rundir.TRACE if attempt is None else rundir.TRACE.replace(".json", f"-attempt-{attempt}.json")))
        if output == "-":
            summary = write_trace(built, sys.stdout)
            sys.stdout.flush()
            where = "stdout"
        else:
            path = Path(output).expanduser()
            if not path.parent.is_dir():
                raise ClusterctlError(f"cannot write {path}: no directory {path.parent}", ExitCode.USAGE)
            if path.is_dir():
                raise ClusterctlError(f"cannot write {path}: it is a directory", ExitCode.USAGE)
            try:
                summary = write_trace_file(built, path)
            except OSError as exc:
                raise ClusterctlError(f"cannot write {path}: {exc.strerror or exc}", ExitCode.USAGE) from None
            where = str(path)
        err_console.print(_summary_line(summary, attempts, where))

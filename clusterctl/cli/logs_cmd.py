"""`clusterctl logs RUN`: one rank's lines, one node's, or an attempt's logs merged in time order."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Annotated, Optional

import typer

from clusterctl.cli.app import err_console
from clusterctl.cli.remote_opts import RemoteOpt, remote_target, run_there
from clusterctl.cli.runarg import RootOpt, RunArg, resolve_run
from clusterctl.errors import ClusterctlError
from clusterctl.rundir import RunDir
from clusterctl.views import logs as runlogs

JOB_CHECK_S = 2.0  # --follow asks the scheduler at most this often whether a job of the run is left


def job_active(run: RunDir) -> Callable[[], bool]:
    """Whether a job of the run is pending or running, asked at most every JOB_CHECK_S seconds.

    A run never submitted has none; when the scheduler cannot be asked, the
    answer stays "yes" so that --follow keeps following rather than stop early.
    """
    from clusterctl.actions.runjobs import active_jobs, backend_of

    last: list[float | bool] = [-JOB_CHECK_S, True]

    def ask() -> bool:
        now = time.monotonic()
        if now - float(last[0]) < JOB_CHECK_S:
            return bool(last[1])
        try:
            answer = bool(active_jobs(run, backend_of(run)))
        except ClusterctlError:
            answer = False
        except Exception:  # noqa: BLE001 - a scheduler hiccup must not end --follow
            answer = True
        last[:] = [now, answer]
        return answer

    return ask


def _write(lines: Iterable[str]) -> None:
    """Plain lines on stdout, flushed as they come; a closed pipe (`| head`) ends quietly."""
    try:
        for line in lines:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise typer.Exit(0) from None


def register(app: typer.Typer) -> None:
    @app.command("logs")
    def logs(
        ctx: typer.Context,
        run: RunArg,
        rank: Annotated[Optional[int], typer.Option("--rank", "-r", help="only this global rank's lines, its label stripped")] = None,
        node: Annotated[
            Optional[str], typer.Option("--node", "-n", metavar="SLOT|HOST", help="only this node's log: its slot number or host name")
        ] = None,
        attempt: Annotated[
            Optional[str], typer.Option("--attempt", "-a", metavar="N|all", help="this attempt, or 'all' in order (default: the latest)")
        ] = None,
        follow: Annotated[
            bool, typer.Option("--follow", "-f", "--wait", "--watch", help="keep printing new lines, new attempts' too, until the run ends (or Ctrl-C)")
        ] = False,
        grep: Annotated[Optional[str], typer.Option("--grep", "-g", metavar="REGEX", help="only lines whose text matches (Python re)")] = None,
        root: RootOpt = None,
        remote: RemoteOpt = None,
    ) -> None:
        """Show a run's logs: a rank's lines, a node's log, or everything of an attempt merged.

        Without --rank or --node, the attempt's batch log (slurm-<job>.out) and
        node logs are merged in time order, each line led by its source: `batch`
        or `<host>/<rank>`. Node log lines carry no time of their own (srun
        writes them as the ranks print), so each takes the time of the last
        stamped line before it in its file, else the attempt's start.
        --attempt all shows every attempt in order, each under a `==> attempt N
        (job J) on HOSTS <==` header; --follow starts at the latest attempt (or
        --attempt N, or the first with all) and goes on into new ones.
        """
        if where := remote_target(remote):
            run_there(where, ctx)
        target = resolve_run(run, root)
        pattern = runlogs.compile_grep(grep)
        infos = runlogs.list_attempts(target)
        if not follow:
            chosen = runlogs.choose_attempts(infos, attempt)
            if attempt is None and (note := runlogs.earlier_failures(target, chosen, run)):
                err_console.print(note)
            selection = runlogs.select(target, chosen, rank, node)
            _write(runlogs.show(target, chosen, selection, pattern))
            return
        first: int | None = None  # the latest now, or the first to come
        if attempt is not None and attempt.strip().lower() == runlogs.ALL:
            first = 1
        elif attempt is not None:
            first = runlogs.choose_attempts(infos, attempt)[0].number
        shown = [i for i in infos if i.number >= (first or (infos[-1].number if infos else 1))]
        selection = runlogs.select(target, shown, rank, node)
        active = job_active(target)
        _write(runlogs.follow(target, selection, first, pattern, lambda: runlogs.run_over(target, active)))

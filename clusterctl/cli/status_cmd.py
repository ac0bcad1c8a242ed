"""`clusterctl status [RUN]` and `clusterctl runs`: what runs are doing, from one derivation (runstate.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Group
from rich.live import Live
from rich.text import Text

from clusterctl.backends import get_backend
from clusterctl.cli.app import err_console, out_console
from clusterctl.cli.options import JsonOpt
from clusterctl.cli.runarg import resolve_run, runs_root
from clusterctl.cli.status_view import run_screen, runs_json, runs_table
from clusterctl.rundir import RunDir
from clusterctl.runstate import FINAL, RunState, derive_many, list_runs

RootOpt = Annotated[Optional[Path], typer.Option("--runs-root", help="where the runs are (default ./runs)", show_default=False)]


def _states(runs: list[RunDir]) -> list[RunState]:
    states, notes = derive_many(runs, get_backend)
    for note in notes:
        err_console.print(f"note: {note}")
    return states


def _shown(run: Optional[str], root: Path | None, show_all: bool) -> list[RunDir]:
    """RUN, else the runs still going (all of them with --all), else the newest run."""
    if run is not None:
        return [resolve_run(run, root)]
    found = list_runs(runs_root(root))
    if show_all or not found:
        return found
    states, _ = derive_many(found, None)  # a cheap first pass from the directories: which may still be going
    going = [st for st in states if st.state not in FINAL]
    return [RunDir(st.path) for st in going] or found[:1]


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status(
        run: Annotated[Optional[str], typer.Argument(
            help="run directory, run id or job id (default: the runs still going, else the newest run)", show_default=False)] = None,
        root: RootOpt = None,
        show_all: Annotated[bool, typer.Option("--all", help="every run under the runs root")] = False,
        watch: Annotated[bool, typer.Option("--watch", "-w", help="refresh until every run shown has ended (Ctrl-C stops)")] = False,
        every: Annotated[float, typer.Option("--every", help="seconds between refreshes with --watch", min=0.2)] = 2.0,
        as_json: JsonOpt = False,
    ) -> None:
        """A run's state (pending with Slurm's reason, training at step N, restarting, completed, failed with the
        culprit, ...), its attempts, latest checkpoint and goodput. One scheduler query per refresh for all runs."""
        runs = _shown(run, root, show_all)
        if not runs:
            err_console.print(f"no runs under {runs_root(root)}")
            raise typer.Exit(0)
        if as_json:
            states = _states(runs)
            data = [st.as_dict() for st in states]
            print(json.dumps(data[0] if run is not None else data, indent=1))
            return
        console = out_console()
        if not watch:
            console.print(Group(*[run_screen(st) for st in _states(runs)]))
            return
        with Live(Text("asking the scheduler..."), console=console, auto_refresh=False) as live:
            while True:
                states = _states(runs)
                live.update(Group(*[run_screen(st) for st in states]), refresh=True)
                if all(st.state in FINAL for st in states):
                    break
                time.sleep(every)

    @app.command("runs")
    def runs_cmd(root: RootOpt = None, as_json: JsonOpt = False) -> None:
        """List the runs under the runs root, newest first: state, step, attempts, last change."""
        where = runs_root(root)
        states = _states(list_runs(where))
        if as_json:
            print(json.dumps([runs_json(st) for st in states], indent=1))
            return
        if not states:
            err_console.print(f"no runs under {where}")
            return
        out_console().print(runs_table(states))

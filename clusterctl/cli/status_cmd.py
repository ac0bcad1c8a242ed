"""`clusterctl status [RUN]` and `clusterctl runs`: what runs are doing, from one derivation (views/state.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Group
from rich.live import Live
from rich.text import Text

from clusterctl.backends import get_backend
from clusterctl.cli.app import err_console, out_console
from clusterctl.cli.options import JsonOpt
from clusterctl.cli.remote_opts import RemoteOpt, remote_target
from clusterctl.cli.runarg import RootOpt, known_runs, resolve_run, search_roots
from clusterctl.cli.status_view import run_screen, runs_json, runs_table
from clusterctl.remote.client import connect
from clusterctl.rundir import RunDir, roots
from clusterctl.views.state import DRY_RUN, GOING, RunState, derive_many


def _where(root: Path | None) -> str:
    """Where runs were listed from, in words: the root given, else the roots searched that exist."""
    if root is not None:
        return str(roots.listing(root))
    existing = [str(r) for r in search_roots(None) if r.is_dir()]
    return ", ".join(existing) if existing else f"{roots.listing(None)} (nor any root submitted into)"


def _states(runs: list[RunDir]) -> list[RunState]:
    states, notes = derive_many(runs, get_backend)
    for note in notes:
        err_console.print(f"note: {note}")
    return states


def _shown(run: Optional[str], root: Path | None, show_all: bool) -> list[RunState]:
    """RUN, else the runs still going (all of them with --all), else the newest run that was submitted (a dry run
    only when there is nothing else): their states, derived once."""
    if run is not None:
        return _states([resolve_run(run, root)])
    states = _states(known_runs(root))
    if show_all or not states:
        return states
    going = [st for st in states if st.state in GOING]
    return going or [next((st for st in states if st.state != DRY_RUN), states[0])]


def _parsed(data: object) -> list[RunState]:
    """A login node's `status --json`: one object for one run, a list otherwise."""
    items = data if isinstance(data, list) else [data]
    return [RunState.from_dict(item) for item in items if isinstance(item, dict)]


def _show(poll: Callable[[], list[RunState]], as_json: bool, watch: bool, every: float, single: bool) -> None:
    """Print the states once (JSON or one screen per run), or refresh them until every run has ended."""
    if as_json:
        data = [st.as_dict() for st in poll()]
        print(json.dumps(data[0] if single and data else data, indent=1))
        return
    console = out_console()
    if not watch:
        console.print(Group(*[run_screen(st) for st in poll()]))
        return
    with Live(Text("asking the scheduler..."), console=console, auto_refresh=False) as live:
        while True:
            states = poll()
            live.update(Group(*[run_screen(st) for st in states]), refresh=True)
            if not any(st.state in GOING for st in states):
                break
            time.sleep(every)


def register(app: typer.Typer) -> None:
    @app.command("status")
    def status(
        run: Annotated[Optional[str], typer.Argument(
            help="run directory, run id or job id (default: the runs still going, else the newest run)", show_default=False)] = None,
        root: RootOpt = None,
        show_all: Annotated[bool, typer.Option("--all", help="every run under the runs root")] = False,
        watch: Annotated[bool, typer.Option("--watch", "-w", "--wait", "--follow", help="refresh until every run shown has ended (Ctrl-C stops)")] = False,
        every: Annotated[float, typer.Option("--every", help="seconds between refreshes with --watch", min=0.2)] = 2.0,
        as_json: JsonOpt = False,
        remote: RemoteOpt = None,
    ) -> None:
        """A run's state (pending with Slurm's reason, training at step N, restarting, completed, failed with the
        culprit, ...), its attempts, latest checkpoint and goodput. One scheduler query per refresh for all runs."""
        if where := remote_target(remote):
            with connect(where) as link:
                args = ["status", *([run] if run else []), *(["--runs-root", str(root)] if root else []),
                        *(["--all"] if show_all else []), "--json"]
                _show(lambda: _parsed(link.json(args)), as_json, watch, every, single=run is not None)
            return
        first = _shown(run, root, show_all)
        if not first:
            if as_json:
                print("[]")
            else:
                err_console.print(f"no runs under {_where(root)}")
            raise typer.Exit(0)
        runs = [RunDir(st.path) for st in first]
        pending = [first]  # the states just derived serve the first screen; each refresh derives again

        def poll() -> list[RunState]:
            return pending.pop() if pending else _states(runs)

        _show(poll, as_json, watch, every, single=run is not None)

    @app.command("runs")
    def runs_cmd(root: RootOpt = None, as_json: JsonOpt = False, remote: RemoteOpt = None) -> None:
        """List the runs, newest first: state, step, attempts, last change. Every run a RUN argument could name:
        those under ./runs, the roots this user submitted into and the sites' (or under --runs-root alone)."""
        there = remote_target(remote)
        if there:
            with connect(there) as link:
                states = _parsed(link.json(["status", "--all", "--json", *(["--runs-root", str(root)] if root else [])]))
        else:
            states = _states(known_runs(root))
        if as_json:
            print(json.dumps([runs_json(st) for st in states], indent=1))
            return
        if not states:  # where it looked, asked only now: the sites' roots are read once per listing
            err_console.print(f"no runs under {f'{there}:{root or roots.DEFAULT}' if there else _where(root)}")
            return
        console = out_console()
        if not console.is_terminal:  # a pipe or a file: whole lines, never a word broken to fit 80 columns
            console.width = 10_000
        console.print(runs_table(states))

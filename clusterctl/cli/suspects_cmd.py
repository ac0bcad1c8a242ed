"""`clusterctl suspects`: the nodes recent verdicts blamed, which new submissions leave out; --clear forgives."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from clusterctl.actions.forgive import widen_grow_jobs
from clusterctl.cli.app import out_console
from clusterctl.cli.options import JsonOpt
from clusterctl.cli.remote_opts import RemoteOpt, remote_target, run_there
from clusterctl.config.site import Reliability
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import roots, suspects
from clusterctl.syntax.units import format_duration


def _root_and_window(runs_root: Path | None, spec: Path | None) -> tuple[Path, float]:
    """The runs root and window a submission of `spec` would use; else --runs-root (or ./runs) and the default window."""
    window_s = Reliability().suspect_hours * 3600
    if spec is not None:
        from clusterctl.plan.job import load_job

        job = load_job(spec)
        window_s = job.site.reliability.suspect_hours * 3600
        if runs_root is None:
            return roots.of_spec(job.spec.runs_root, job.site.runs_root), window_s
    return roots.listing(runs_root), window_s


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _local(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


def rows(records: dict[str, suspects.NodeRecord], window_s: float, now: float, everything: bool) -> list[dict[str, Any]]:
    """The stable `--json` objects, one per node: its latest blame and whether it is still avoided."""
    out = []
    for node, rec in records.items():
        state = "cleared" if rec.cleared else ("expired" if not rec.active(window_s, now) else "drill" if rec.latest.drill else "active")
        if state not in ("active", "drill") and not everything:
            continue
        s = rec.latest
        out.append(
            {
                "node": node,
                "state": state,
                "reason": s.reason,
                "evidence": s.evidence,
                "code": s.code,
                "run": s.run,
                "time": s.time,
                "until": rec.until(window_s) if window_s > 0 else None,
                "blames": rec.blames,
                "cleared_by": rec.cleared.by if rec.cleared else None,
                "drill": rec.latest.drill,
            }
        )
    return out


def _clear(root: Path, nodes: list[str]) -> None:
    records = suspects.nodes(root)
    known = [n for n in nodes if n in records and records[n].cleared is None]
    console = out_console()
    if known:
        try:
            suspects.clear(root, known)
        except OSError as exc:
            raise ClusterctlError(f"cannot write {suspects.path(root)}: {exc.strerror or exc}", ExitCode.BAD_CONFIG) from None
    for node in nodes:
        if node in known:
            s = records[node].latest
            console.print(f"cleared {node} (last blamed {_local(s.time)}: {s.reason}, run {s.run})")
        else:
            console.print(f"{node} is not a suspect in {root}; nothing to clear")
    if known:
        widen_grow_jobs(root, known, lambda line: console.print(line, markup=False, highlight=False))


def register(app: typer.Typer) -> None:
    @app.command("suspects")
    def suspects_command(
        ctx: typer.Context,
        runs_root: Annotated[
            Optional[Path], typer.Option("--runs-root", metavar="DIR", help="the runs root (default: the --spec's, else ./runs)")
        ] = None,
        spec: Annotated[
            Optional[Path],
            typer.Option("--spec", metavar="JOB.yaml", help="a job spec: use the runs root and site window its submission would"),
        ] = None,
        everything: Annotated[bool, typer.Option("--all", help="include expired and cleared suspects")] = False,
        clear: Annotated[
            Optional[list[str]], typer.Option("--clear", metavar="NODE", help="forgive NODE: new submissions may use it again (repeatable)")
        ] = None,
        as_json: JsonOpt = False,
        remote: RemoteOpt = None,
    ) -> None:
        """List suspect nodes (blamed by a hang, straggler, preflight, lost-node or repeated-failure verdict).

        A node blamed for a fault `clusterctl drill` injected is listed with state `drill`: later submissions
        do not avoid it unless their spec says `topology.avoid_drill_suspects: true`.
        """
        if where := remote_target(remote):
            run_there(where, ctx)
        root, window_s = _root_and_window(runs_root, spec)
        if not root.is_dir():
            raise ClusterctlError(f"no runs root {root}: nothing was submitted there (give --runs-root DIR or --spec)",
                                  ExitCode.USAGE)
        if clear:
            _clear(root, clear)
            return
        now = time.time()
        found = rows(suspects.nodes(root), window_s, now, everything)
        if as_json:
            typer.echo(json.dumps(found))
            return
        console = out_console()
        if not found:
            console.print(f"no {'' if everything else 'active '}suspect nodes in {root}")
            return
        hours = f"{window_s / 3600:g} h" if window_s > 0 else "off"
        table = Table(title=f"Suspect nodes in {root} (avoided for {hours})", title_justify="left")
        with_state = everything or any(row["drill"] for row in found)  # a drill's culprit: listed, not avoided
        columns = ["node", *(["state"] if with_state else []), "evidence", "reason", "code", "run", "when", "until"]
        for col in columns:
            table.add_column(col, justify="right" if col == "code" else "left")
        for row in found:
            ago = format_duration(max(0.0, now - row["time"]))
            until = _local(row["until"]) if row["until"] is not None else "-"
            cells = [row["node"], *([row["state"]] if with_state else []), row["evidence"] or "-", row["reason"],
                     str(row["code"]), row["run"]]
            table.add_row(*cells, f"{_local(row['time'])} ({ago} ago)", until)
        console.print(table)

"""`clusterctl checkpoints RUN`: every generation, committed or not, and whether it verifies."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from clusterctl.cli.app import out_console
from clusterctl.cli.options import JsonOpt
from clusterctl.cli.remote_opts import RemoteOpt, remote_target, run_there
from clusterctl.cli.runarg import RootOpt, resolve_run
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import runjson


def adopt_in(directory: Path, to_stderr: bool = False) -> None:
    """Seal what `directory` holds that is refused today (checkpoint/adoption.py), saying what was and was not."""
    from clusterctl.checkpoint import adoption, trust
    from clusterctl.rundir import ownership

    why = ownership.untrusted(directory)
    if why:
        raise ClusterctlError(f"not adopting anything in {directory}: {why}", ExitCode.NO_PERMISSION)
    done = adoption.adopt_untrusted(directory, trust.user_key())
    lines = [f"adopted {item.name}: verified and sealed with your key" if item.problem is None
             else f"not adopted {item.name}: {item.problem}" for item in done]
    for line in lines or [f"nothing to adopt in {directory}: no whole generation in it is refused"]:
        typer.echo(line, err=to_stderr)  # --json: stdout keeps the listing alone


def checkpoint_dir(target: Path, root: Path | None = None) -> Path:
    """A run directory (its checkpoint.dir, else <run>/checkpoints), a checkpoint directory itself, or a run's name."""
    plan = runjson.read(target) if target.is_dir() else None
    if plan is not None:
        return plan.checkpoint_dir(target)
    if target.is_dir():
        return target
    return checkpoint_dir(resolve_run(str(target), root).path)  # a run id or job id; else says where it looked


def register(app: typer.Typer) -> None:
    @app.command("checkpoints")
    def checkpoints(
        ctx: typer.Context,
        target: Annotated[Path, typer.Argument(metavar="RUN|DIR", help="run directory, run id or job id of a run, or a checkpoint directory")],
        check: Annotated[bool, typer.Option("--verify/--no-verify", help="recompute sizes and checksums")] = True,
        adopt: Annotated[bool, typer.Option("--adopt", help=(
            "trust this directory's unsealed generations once (written before seals, or copied in): each that is"
            " yours alone and verifies is sealed with your key, and resumed from like your own"))] = False,
        as_json: JsonOpt = False,
        root: RootOpt = None,
        remote: RemoteOpt = None,
    ) -> None:
        """List checkpoint generations: committed, torn, in progress; verify the committed ones."""
        if where := remote_target(remote):
            run_there(where, ctx)
        from clusterctl.checkpoint import latest_committed, list_generations, verify

        directory = checkpoint_dir(target, root)
        if adopt:
            adopt_in(directory, to_stderr=as_json)
        try:
            entries = list_generations(directory)
            latest = latest_committed(directory)
        except PermissionError:
            raise ClusterctlError(f"cannot read the checkpoint directory {directory}: permission denied (its owner's"
                                  " runs_mode decides who may)", ExitCode.BACKEND_UNAVAILABLE) from None
        rows = []
        for entry in entries:
            problems = verify(entry.path) if (check and entry.committed) else []
            rows.append(
                {
                    "name": entry.name,
                    "step": entry.step,
                    "kind": entry.kind,
                    "bytes": entry.size_bytes,
                    "world_size": entry.world_size,
                    "latest": latest is not None and entry.path == latest.path,
                    "verified": (not problems) if (check and entry.committed) else None,
                    "problems": problems or ([entry.problem] if entry.problem else []),
                }
            )
        if as_json:
            typer.echo(json.dumps({"directory": str(directory), "generations": rows}))
        else:
            table = Table(title=f"Checkpoints in {directory}", title_justify="left")
            for col in ("step", "state", "size", "ranks", "age", "verified"):
                table.add_column(col, justify="right" if col in ("step", "size", "ranks") else "left")
            for entry, row in zip(entries, rows):
                state = row["kind"] + (" (latest)" if row["latest"] else "")
                verified = {True: "ok", False: "; ".join(row["problems"]), None: "-"}[row["verified"]]
                if row["verified"] is None and row["problems"]:
                    verified = "; ".join(row["problems"])
                age = time.time() - entry.mtime
                table.add_row(
                    str(row["step"]), state, f"{row['bytes'] / 1e6:.1f} MB", str(row["world_size"] or "?"),
                    f"{age / 60:.0f} min", verified,
                )
            out_console().print(table)
            if not entries:
                out_console().print("no generations yet")
        if any(row["verified"] is False for row in rows):
            raise typer.Exit(int(ExitCode.BAD_CONFIG))

"""`clusterctl version`, and `submit-run`: what a laptop asks of the login node's clusterctl.

A laptop renders a run, ships its directory and then has the login node's
clusterctl submit it; before anything is shipped it checks that both sides
agree on the run directory's format (`version --json`).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from clusterctl import __version__, rundir
from clusterctl.actions.submit import submit_rendered
from clusterctl.backends import BACKENDS, get_backend
from clusterctl.cli.app import out_console
from clusterctl.cli.options import JsonOpt
from clusterctl.cli.suspects_cmd import rows as suspect_rows
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.rundir import RunDir, access, roots, suspects


def facts(expand: list[str], with_suspects: bool = False) -> dict[str, object]:
    """This installation: its version, run-directory format, interpreter, paths expanded here and (for a
    laptop's submit, in the same round trip) the suspect nodes of each expanded runs root."""
    expanded: dict[str, str | None] = {}
    blamed: dict[str, list[dict[str, object]]] = {}
    for text in expand:
        path, _unset = roots.expand(text)
        expanded[text] = str(path) if path is not None else None
        if with_suspects and path is not None:
            blamed[text] = suspect_rows(suspects.nodes(path), 0.0, time.time(), True)
    found: dict[str, object] = {"version": __version__, "run_dir_format": rundir.FORMAT, "python": sys.executable,
                                "cwd": str(Path.cwd()), "expanded": expanded}
    if with_suspects:
        found["suspects"] = blamed
    return found


def register(app: typer.Typer) -> None:
    @app.command("version")
    def version(
        as_json: JsonOpt = False,
        # What a laptop asks of a login node's clusterctl (plumbing: hidden from help).
        expand: Annotated[Optional[list[str]], typer.Option("--expand", hidden=True, help="also expand this path here")] = None,
        with_suspects: Annotated[bool, typer.Option("--suspects", hidden=True, help="with --expand: their suspect nodes")] = False,
    ) -> None:
        """Print clusterctl's version and the run-directory format it reads and writes."""
        found = facts(expand or [], with_suspects)
        if as_json:
            print(json.dumps(found))
            return
        out_console().print(f"clusterctl {found['version']} (run directory format {found['run_dir_format']}, python {found['python']})")

    @app.command("submit-run", hidden=True)
    def submit_run(
        run: Annotated[Path, typer.Argument(help="a complete run directory, as `submit --remote` shipped it")],
        backend: Annotated[str, typer.Option("--backend", help=f"one of {', '.join(BACKENDS)}")] = "slurm",
        chdir: Annotated[Optional[Path], typer.Option("--chdir", help="the ranks' working directory")] = None,
    ) -> None:
        """Submit a run directory rendered elsewhere; prints one JSON object (job id, warnings)."""
        target = RunDir(run.resolve())
        if not target.sbatch.is_file():
            raise ClusterctlError(f"{run} is not a rendered run directory (no {rundir.SBATCH})", ExitCode.USAGE)
        chosen = get_backend(backend)
        chosen.check()
        workdir = chdir.resolve() if chdir is not None else target.path
        if not workdir.is_dir():
            raise ClusterctlError(f"--chdir {workdir}: no such directory on this machine", ExitCode.USAGE)
        shared = access.of_run(target.path)
        try:
            if shared is not None:
                shared.apply(target.path)  # the shipped files arrive private: the run's own access, with this machine's groups
        except KeyError:
            raise ClusterctlError(f"runs_group {shared.group!r} is not a group on this login node (getent group)",  # type: ignore[union-attr]
                                  ExitCode.BAD_CONFIG) from None
        done = submit_rendered(target, chosen, workdir, [f"--chdir={workdir}"])
        print(json.dumps({"run": str(target.path), "job_id": done.job_id, "display_id": done.display_id,
                          "backend": done.backend, "warnings": list(done.warnings)}))

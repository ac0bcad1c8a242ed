"""Command-line interface: `clusterctl <command>`."""

from __future__ import annotations

from typing import Annotated

import typer

from clusterctl.cli import (
    cancel_cmd,
    checkpoints_cmd,
    drill_cmd,
    logs_cmd,
    plan_cmd,
    qualify_cmd,
    record_cmd,
    render_cmd,
    report_cmd,
    requeue_cmd,
    schema_cmd,
    site_cmd,
    status_cmd,
    submit_cmd,
    suspects_cmd,
    trace_cmd,
    version_cmd,
)
from clusterctl.cli.app import new_app

app = new_app("Compile a job spec into a topology-aware distributed PyTorch job on Slurm.")


def _print_version(wanted: bool) -> None:
    if wanted:
        from clusterctl import __version__, rundir

        print(f"clusterctl {__version__} (run directory format {rundir.FORMAT})")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_print_version,
                                          help="print the version and exit")] = False,
) -> None:
    """Compile a job spec into a topology-aware distributed PyTorch job on Slurm."""


plan_cmd.register(app)
render_cmd.register(app)
submit_cmd.register(app)
status_cmd.register(app)
logs_cmd.register(app)
report_cmd.register(app)
trace_cmd.register(app)
record_cmd.register(app)
checkpoints_cmd.register(app)
drill_cmd.register(app)
qualify_cmd.register(app)
cancel_cmd.register(app)
requeue_cmd.register(app)
suspects_cmd.register(app)
schema_cmd.register(app)
version_cmd.register(app)
app.add_typer(site_cmd.site_app, name="site")


def main() -> None:
    refuse_other_format()
    app()


def refuse_other_format() -> None:
    """A laptop's clusterctl says which run-directory format it speaks; a login node with another refuses (69)."""
    import os
    import sys

    from clusterctl import __version__, rundir
    from clusterctl.remote.client import FORMAT_ENV

    wanted = os.environ.get(FORMAT_ENV)
    if wanted and wanted != str(rundir.FORMAT):
        print(f"error: clusterctl on this machine is {__version__} (run directory format {rundir.FORMAT}); the caller's"
              f" speaks format {wanted}: install the same release on both", file=sys.stderr)
        raise SystemExit(69)

"""`clusterctl render`: the exact files a submission would write, nothing submitted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from clusterctl.cli.app import out_console
from clusterctl.cli.options import AllowOomOpt, JsonOpt, SetOpt, SiteOpt, SpecArg, overrides
from clusterctl.plan.job import load_job
from clusterctl.render.runfiles import write_rendered


def register(app: typer.Typer) -> None:
    @app.command("render")
    def render(
        spec: SpecArg,
        out: Annotated[Path, typer.Option("--output", "-o", help="directory to write job.sbatch, wrapper.sh, run.json")],
        standalone: Annotated[
            bool, typer.Option("--standalone", help="scripts that need no clusterctl on the compute nodes")
        ] = False,
        site: SiteOpt = None,
        set_: SetOpt = None,
        allow_oom: AllowOomOpt = False,
        as_json: JsonOpt = False,
    ) -> None:
        """Render the batch script, rank wrapper and run.json into a directory."""
        job = load_job(spec, overrides(set_, allow_oom), site)
        written = write_rendered(job, out.resolve(), standalone=standalone)
        if as_json:
            print(json.dumps({"written": [str(p) for p in written], "sbatch": str(out.resolve() / "job.sbatch")}, indent=1))
            return
        console = out_console()
        for path in written:
            console.print(f"wrote {path}")
        console.print(f"submit it with: sbatch {out.resolve() / 'job.sbatch'}")

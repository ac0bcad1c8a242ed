"""`clusterctl plan`: rank map, groups, traffic, batch and memory, before anything runs."""

from __future__ import annotations

import json

import typer

from clusterctl.cli.app import out_console
from clusterctl.cli.options import JsonOpt, SetOpt, SiteOpt, SpecArg
from clusterctl.cli.plan_view import render_plan
from clusterctl.plan.job import load_job


def register(app: typer.Typer) -> None:
    @app.command("plan")
    def plan(spec: SpecArg, site: SiteOpt = None, set_: SetOpt = None, as_json: JsonOpt = False) -> None:
        """Check a job against its site and show how it will be laid out."""
        job = load_job(spec, set_ or [], site)
        if as_json:
            typer.echo(json.dumps(job.plan.as_json(), separators=(",", ":")))
            return
        render_plan(job.plan, out_console())

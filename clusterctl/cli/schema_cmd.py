"""`clusterctl schema`: the JSON Schema of job.yaml, for editors and CI."""

from __future__ import annotations

import json

import typer

from clusterctl.config.specschema import json_schema


def register(app: typer.Typer) -> None:
    @app.command("schema")
    def schema() -> None:
        """Print the JSON Schema of job.yaml (point your editor's YAML plugin at it)."""
        typer.echo(json.dumps(json_schema(), indent=2, sort_keys=True))

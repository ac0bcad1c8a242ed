"""Options shared by the commands that read a job spec."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

SpecArg = Annotated[Path, typer.Argument(help="job spec (YAML)", show_default=False)]
SiteOpt = Annotated[
    Optional[str],
    typer.Option("--site", help="site config name or path (overrides the spec's site)"),
]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", "-s", help="override a spec field: --set parallel.tp=8 (repeatable)"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print machine-readable JSON instead of tables")]

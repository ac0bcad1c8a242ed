"""Options shared by the commands that read a job spec."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

SpecArg = Annotated[Path, typer.Argument(metavar="SPEC", help="job spec (YAML)", show_default=False)]
SiteOpt = Annotated[
    Optional[str],
    typer.Option("--site", help="site config name or path (overrides the spec's site)"),
]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", "-s", metavar="FIELD=VALUE", help="override a spec field: --set parallel.tp=8 (repeatable)"),
]
AllowOomOpt = Annotated[
    bool, typer.Option("--allow-oom", help="submit though the memory estimate exceeds the GPU (sets allow_oom: true in the run's spec)")
]


def overrides(set_: list[str] | None, allow_oom: bool = False) -> list[str]:
    """The --set overrides, with --allow-oom as the spec field it stands for."""
    return [*(set_ or []), *(["allow_oom=true"] if allow_oom else [])]


JsonOpt = Annotated[bool, typer.Option("--json", help="print machine-readable JSON instead of tables")]

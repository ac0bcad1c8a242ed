"""`clusterctl logs` (being written)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Adds nothing yet."""

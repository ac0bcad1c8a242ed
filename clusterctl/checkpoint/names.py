"""Names inside a checkpoint directory: the one place that knows them.

Committed generations are `step-00000120` (zero-padded so that names sort as
steps do); a save in progress writes `.tmp-step-00000120-<token>`; retention
renames a generation to `.trash-step-00000120-<token>` before deleting it, so
a half-deleted generation never looks committed; a committed generation that a
newer save of the same or an earlier step replaces is renamed aside to
`.superseded-step-00000120-<token>` and kept for a person to look at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MANIFEST = "manifest.json"
DCP_METADATA = ".metadata"
STEP_DIGITS = 8
SNAPSHOTS_KEPT = 2  # in-memory snapshots (snapshots.py) each rank keeps, and of its peer's: plan/hostmemory.py sizes them

COMMITTED = "committed"
TEMPORARY = "temporary"
TRASH = "trash"
SUPERSEDED = "superseded"

_PATTERNS = {
    COMMITTED: re.compile(r"^step-(\d{8,})$"),
    TEMPORARY: re.compile(r"^\.tmp-step-(\d{8,})-([0-9a-z]+(?:-[0-9a-z]+)*)$"),
    TRASH: re.compile(r"^\.trash-step-(\d{8,})-([0-9a-z]+(?:-[0-9a-z]+)*)$"),
    SUPERSEDED: re.compile(r"^\.superseded-step-(\d{8,})-([0-9a-z]+(?:-[0-9a-z]+)*)$"),
}


@dataclass(frozen=True)
class ParsedName:
    kind: str
    step: int
    token: str | None


def committed(step: int) -> str:
    return f"step-{step:0{STEP_DIGITS}d}"


def temporary(step: int, token: str) -> str:
    return f".tmp-{committed(step)}-{token}"


def trash(step: int, token: str) -> str:
    return f".trash-{committed(step)}-{token}"


def superseded(step: int, token: str) -> str:
    return f".superseded-{committed(step)}-{token}"


def parse(name: str) -> ParsedName | None:
    """What a directory entry is, or None for anything this package did not make."""
    for kind, pattern in _PATTERNS.items():
        match = pattern.match(name)
        if match:
            token = match.group(2) if kind != COMMITTED else None
            return ParsedName(kind, int(match.group(1)), token)
    return None

"""Retention: keep the newest K committed generations; clear what crashed saves left.

Runs on the coordinator only after a commit has been made durable, so the
generation just committed is the newest and is never a candidate: a save that
fails part-way deletes nothing. Only whole generations count towards `keep`;
a damaged (torn) `step-…` directory is neither counted nor deleted, so that
`clusterctl checkpoints` can show it to a person. A generation is renamed to `.trash-…` (one
atomic step: it stops being committed) before its files are deleted, so a
crash during deletion never leaves a torn `step-…` directory. Temporaries of
other saves are removed only when they cannot be in flight: this
checkpointer's own earlier ones (it runs one save at a time), or anyone's
untouched for `stale_after` seconds.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from clusterctl.checkpoint import durable, names, phases
from clusterctl.checkpoint.generations import open_generation
from clusterctl.checkpoint.manifest import ManifestError


def _is_whole(path: Path) -> bool:
    try:
        open_generation(path)
    except (ManifestError, OSError):
        return False
    return True


def prune(
    directory: Path,
    *,
    keep: int,
    committed_step: int,
    current_token: str,
    owner: str,
    stale_after: float,
    now: float | None = None,
) -> list[str]:
    """Remove old generations, leftover trash and stale temporaries; the names removed."""
    now = time.time() if now is None else now
    removed: list[str] = []
    entries = []
    with os.scandir(directory) as it:
        for entry in it:
            parsed = names.parse(entry.name)
            if parsed is not None and entry.is_dir(follow_symlinks=False):
                entries.append((parsed, Path(entry.path)))

    committed = sorted(((p.step, path) for p, path in entries if p.kind == names.COMMITTED), reverse=True)
    whole = [(step, path) for step, path in committed if _is_whole(path)]
    to_trash = [(step, path) for step, path in whole[keep:] if step < committed_step]
    trashed = []
    for step, path in to_trash:
        phases.enter(phases.RETENTION, committed_step)
        target = directory / names.trash(step, current_token)
        os.rename(path, target)
        trashed.append((step, target))
    if trashed:
        phases.enter(phases.RETENTION, committed_step)
        durable.fsync_dir(directory)
    trashed += [(p.step, path) for p, path in entries if p.kind == names.TRASH]
    for step, path in trashed:
        durable.remove_tree(path, step=committed_step, phase=phases.RETENTION)
        removed.append(path.name)

    for parsed, path in entries:
        if parsed.kind != names.TEMPORARY or parsed.token == current_token:
            continue
        ours = parsed.token is not None and parsed.token.startswith(owner + "-")
        if ours or now - durable.newest_mtime(path) > stale_after:
            durable.remove_tree(path, step=committed_step, phase=phases.CLEANUP)
            removed.append(path.name)
    return removed

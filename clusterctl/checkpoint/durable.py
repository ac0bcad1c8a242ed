"""File-system steps whose order the commit protocol depends on.

A rename is atomic but not durable until its directory is fsynced; a file's
contents are not durable until the file is fsynced. Deleting a tree goes file
by file so that a crash drill can stop it half-way.
"""

from __future__ import annotations

import os
from pathlib import Path

from clusterctl.checkpoint import phases


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, data: bytes, *, step: int, write_phase: str, fsync_phase: str) -> None:
    """Write and fsync a new file, announcing both steps to the phase hook."""
    phases.enter(write_phase, step)
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        phases.enter(fsync_phase, step)
        os.fsync(fh.fileno())


def remove_tree(path: Path, *, step: int, phase: str) -> None:
    """Delete a directory tree bottom-up, one entry at a time; missing entries are fine."""
    if not path.exists():
        return
    for root, dirs, files in os.walk(path, topdown=False):
        for names, remove in ((files, os.unlink), (dirs, os.rmdir)):
            for name in names:
                phases.enter(phase, step)
                try:
                    remove(os.path.join(root, name))
                except FileNotFoundError:
                    pass
    phases.enter(phase, step)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass


def newest_mtime(path: Path) -> float:
    """The latest modification time of a directory and its direct entries (0 if gone)."""
    try:
        newest = path.stat().st_mtime
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
                except FileNotFoundError:
                    continue
    except FileNotFoundError:
        return 0.0
    return newest

"""The shared-filesystem marker: the controller writes it on the first node, each rank's `shared_fs` check reads it.

A node-local checkpoint directory looks fine until a restart resumes from it
on another node and finds nothing. The controller writes the marker before
ranks start; each rank then proves it sees the same file, holding the same
attempt's id, in its checkpoint directory (rank/preflight/sharedfs.py). The
id is a hash of the attempt token (`marker_id`): the token itself never
reaches a file name or a file another user might read.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from clusterctl.checkpoint.durable import fsync_dir

MARKER_PREFIX = ".clusterctl-shared-"


def marker_id(token: str) -> str:
    """The attempt's name in the marker: a hash of its token, which only the attempt's processes can compute."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def marker_path(directory: str, token: str) -> str:
    return os.path.join(directory, MARKER_PREFIX + marker_id(token))


def write_shared_marker(directory: str, token: str, replaces: Sequence[str] = ()) -> str:
    """Write `<directory>/.clusterctl-shared-<id>` holding the attempt's id (`marker_id`); return its path.

    The first node writes it before ranks start; every other node then proves
    it sees the same directory. Written under a temporary name, fsynced and
    renamed (parent fsynced too), so no node ever reads a torn marker.

    `replaces` names, by id, markers that earlier attempts of the same run
    left in this directory: once the new marker is in place they are removed
    (only `<directory>/.clusterctl-shared-<id>` for those ids, never
    anything matched by pattern: another run may share the directory).
    """
    if not token:
        raise ValueError("an empty attempt token names no attempt")
    os.makedirs(directory, exist_ok=True)
    mine = marker_id(token)
    path = marker_path(directory, token)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, mine.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(Path(directory))
    for old in set(replaces):
        if old != mine and _name_ok(old):
            try:
                os.unlink(os.path.join(directory, MARKER_PREFIX + old))
            except OSError:  # gone already, or not ours to remove: the new marker counts, not the old ones
                pass
    return path


def _name_ok(name: str) -> bool:
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")

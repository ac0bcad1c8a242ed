"""The shared-filesystem marker: the first node writes it, the `shared_fs` check looks for it on every node.

A node-local checkpoint directory looks fine until a restart resumes from it
on another node and finds nothing. The controller, on the first node, writes
the marker before ranks start; each rank then proves it sees the same file,
holding the same attempt's id, in its checkpoint directory. The id is a hash
of the attempt token (`marker_id`): the token itself never reaches a file name
or a file another user might read.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any

from clusterctl.runtime.preflight.common import _fsync_dir, _one_line, _skip
from clusterctl.runtime.preflight.context import CheckResult, PreflightContext

# How long shared_fs waits for the first node's marker to appear before
# failing: some network filesystems publish a new file to other clients with a
# short delay. Only a node that fails the check pays it.
SHARED_MARKER_WAIT_S = 3.0

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
    _fsync_dir(directory)
    for old in set(replaces):
        if old != mine and _name_ok(old):
            try:
                os.unlink(os.path.join(directory, MARKER_PREFIX + old))
            except OSError:  # gone already, or not ours to remove: the new marker counts, not the old ones
                pass
    return path


def _name_ok(name: str) -> bool:
    return bool(name) and "/" not in name and "\0" not in name and name not in (".", "..")


def check_shared_fs(ctx: PreflightContext) -> CheckResult:
    """The first node's marker is visible here: the checkpoint directory is shared.

    A node-local checkpoint directory looks fine until a restart resumes from
    it on another node and finds nothing (or an old generation).
    """
    if ctx.shared_marker is None:
        return _skip("shared_fs", "no shared marker to look for")
    path = ctx.shared_marker
    data: dict[str, Any] = {"marker": path}
    content = _read_marker(path)
    data["found"] = content is not None
    if content is None:
        return CheckResult(
            "shared_fs",
            False,
            False,
            f"checkpoint directory is not shared with the first node: marker {path} missing on {ctx.host}",
            data,
        )
    if ctx.shared_token is None:
        data["token_checked"] = False
        return CheckResult("shared_fs", True, False, f"marker {path} visible on {ctx.host}", data)
    data["token_checked"] = True
    data["token_matches"] = content.strip() == marker_id(ctx.shared_token.strip())
    if not data["token_matches"]:
        shown = content.strip()[:64]
        return CheckResult(
            "shared_fs",
            False,
            False,
            _one_line(
                f"checkpoint directory is not shared with the first node: marker {path} on {ctx.host} "
                f"holds another attempt's id ({shown!r}, expected {marker_id(ctx.shared_token.strip())!r})"
            ),
            data,
        )
    return CheckResult(
        "shared_fs", True, False, f"marker {path} on {ctx.host} holds this attempt's id", data
    )


def _read_marker(path: str) -> str | None:
    deadline = time.monotonic() + SHARED_MARKER_WAIT_S
    while True:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except FileNotFoundError:
            pass
        if time.monotonic() >= deadline:
            return None
        try:
            # Listing the parent makes NFS clients revalidate their view of it.
            os.listdir(os.path.dirname(path) or ".")
        except OSError:
            pass
        time.sleep(0.2)

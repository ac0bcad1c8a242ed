"""The shared-filesystem marker: the first node writes it, the `shared_fs` check looks for it on every node.

A node-local checkpoint directory looks fine until a restart resumes from it
on another node and finds nothing. The controller, on the first node, writes
the marker (named by the attempt token) before ranks start; each rank then
proves it sees the same file, and the same token, in its checkpoint directory.
"""

from __future__ import annotations

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


def write_shared_marker(directory: str, token: str, replaces: Sequence[str] = ()) -> str:
    """Write `<directory>/.clusterctl-shared-<token>` holding the token; return its path.

    The first node writes it before ranks start; every other node then proves
    it sees the same directory. Written under a temporary name, fsynced and
    renamed (parent fsynced too), so no node ever reads a torn marker.

    `replaces` names, by token, markers that earlier attempts of the same run
    left in this directory: once the new marker is in place they are removed
    (only `<directory>/.clusterctl-shared-<token>` for those tokens, never
    anything matched by pattern: another run may share the directory).
    """
    if not _marker_token_ok(token):
        raise ValueError(f"attempt token {token!r} cannot be part of a file name")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, MARKER_PREFIX + token)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, token.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(directory)
    for old in set(replaces):
        if old != token and _marker_token_ok(old):
            try:
                os.unlink(os.path.join(directory, MARKER_PREFIX + old))
            except OSError:  # gone already, or not ours to remove: the new marker counts, not the old ones
                pass
    return path


def _marker_token_ok(token: str) -> bool:
    return bool(token) and "/" not in token and "\0" not in token and token not in (".", "..")


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
    data["token_matches"] = content.strip() == ctx.shared_token.strip()
    if not data["token_matches"]:
        shown = content.strip()[:64]
        return CheckResult(
            "shared_fs",
            False,
            False,
            _one_line(
                f"checkpoint directory is not shared with the first node: marker {path} on {ctx.host} "
                f"holds another attempt's token ({shown!r}, expected {ctx.shared_token!r})"
            ),
            data,
        )
    return CheckResult(
        "shared_fs", True, False, f"marker {path} on {ctx.host} holds this attempt's token", data
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

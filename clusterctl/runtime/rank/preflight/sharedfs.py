"""The `shared_fs` check: the controller's marker (wire/sharedmarker.py) is visible from every node.

Each rank proves it sees the file the controller wrote on the first node,
holding the same attempt's id, in its checkpoint directory.
"""

from __future__ import annotations

import os
import time
from typing import Any

from clusterctl.runtime.rank.preflight.common import _one_line, _skip
from clusterctl.runtime.rank.preflight.context import CheckResult, PreflightContext
from clusterctl.runtime.wire.sharedmarker import marker_id

# How long shared_fs waits for the first node's marker to appear before
# failing: some network filesystems publish a new file to other clients with a
# short delay. Only a node that fails the check pays it.
SHARED_MARKER_WAIT_S = 3.0


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

"""The `dirs` check: each directory a rank needs exists and takes a durable write.

Writing, fsyncing and removing a probe file catches read-only remounts, full
or over-quota filesystems and stale mounts before a checkpoint save does.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from clusterctl.runtime.rank.preflight.common import _errno_text, _one_line, _os_error, _remove_quietly, _skip
from clusterctl.runtime.rank.preflight.context import CheckResult, PreflightContext


def check_dirs(ctx: PreflightContext) -> CheckResult:
    """Each directory exists (created if missing) and takes a durable write.

    Creating, fsyncing and removing a file proves more than access(2): it
    catches read-only remounts, full or over-quota filesystems and stale
    mounts before a checkpoint save runs into them.
    """
    if not ctx.dirs:
        return _skip("dirs", "no directories to check")
    seen: list[dict[str, Any]] = []
    first_failure: str | None = None
    failures = 0
    for directory in ctx.dirs:
        error = _probe_dir(directory, ctx)
        fact: dict[str, Any] = {"path": directory, "ok": error is None}
        seen.append(fact)
        if error is not None:
            fact["error"] = error
            failures += 1
            if first_failure is None:
                first_failure = f"directory {directory} is not writable on {ctx.host}: {error}"
    data = {"dirs": seen}
    if first_failure is not None:
        more = f" (and {failures - 1} more)" if failures > 1 else ""
        return CheckResult("dirs", False, False, _one_line(first_failure + more), data)
    return CheckResult("dirs", True, False, f"{len(ctx.dirs)} directories writable on {ctx.host}", data)


def _probe_dir(directory: str, ctx: PreflightContext) -> str | None:
    """None when a file can be written, fsynced and removed in `directory`, else the errno text."""
    if not directory:
        return "empty path"
    try:
        os.makedirs(directory, exist_ok=True)
    except FileExistsError:
        return _errno_text(errno.ENOTDIR)  # a file is in the way
    except OSError as exc:
        return _os_error(exc)
    probe = os.path.join(directory, f".clusterctl-preflight-{ctx.host}-{ctx.rank}-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError as exc:
        return _os_error(exc)
    try:
        try:
            os.write(fd, b"clusterctl preflight\n")
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        _remove_quietly(probe)
        return _os_error(exc)
    try:
        os.unlink(probe)
    except OSError as exc:
        return _os_error(exc)
    return None

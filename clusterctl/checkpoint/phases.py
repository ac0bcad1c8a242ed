"""Named points inside a save, for crash drills and progress reports.

The protocol calls `enter(phase, step)` just before each step that changes
the disk. Nothing listens in production (one `is None` test per call); a
crash drill installs a hook that records the phase or kills the process there,
which is how the drill proves that a crash at every point leaves a loadable
newest committed generation.
"""

from __future__ import annotations

from typing import Callable

SHARD_WRITE = "shard_write"  # bytes of a rank's shard going to its file
SHARD_FSYNC = "shard_fsync"  # a finished shard file being fsynced
DCP_METADATA = "dcp_metadata"  # the coordinator writing DCP's .metadata
MANIFEST_WRITE = "manifest_write"
MANIFEST_FSYNC = "manifest_fsync"
DIR_FSYNC = "dir_fsync"  # the temporary generation's directory entries made durable
RENAME = "rename"  # the atomic rename that commits
PARENT_FSYNC = "parent_fsync"  # the rename made durable
RETENTION = "retention"  # old generations renamed to trash and deleted
CLEANUP = "cleanup"  # stale temporaries of crashed saves deleted

PHASES: tuple[str, ...] = (
    SHARD_WRITE,
    SHARD_FSYNC,
    DCP_METADATA,
    MANIFEST_WRITE,
    MANIFEST_FSYNC,
    DIR_FSYNC,
    RENAME,
    PARENT_FSYNC,
    RETENTION,
    CLEANUP,
)

# Not a phase to crash in: the event that the rename has happened.
COMMITTED = "committed"

Hook = Callable[[str, int], None]
_hook: Hook | None = None


def set_hook(hook: Hook | None) -> Hook | None:
    """Install `hook(phase, step)` (None removes it); returns the previous one."""
    global _hook
    previous, _hook = _hook, hook
    return previous


def enter(phase: str, step: int) -> None:
    if _hook is not None:
        _hook(phase, step)

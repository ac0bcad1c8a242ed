"""A node's private folder in host memory for one run: what its ranks hand one another, and their snapshots.

    root: $CLUSTERCTL_SNAPSHOTS, else /dev/shm/clusterctl-<uid>
    <root>/<run id>/<node>/   one node's files of one run (the node's server removes it at the job's end)

Standard library only: a rank reads it before it imports torch.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

ROOT_ENV = "CLUSTERCTL_SNAPSHOTS"


def default_root() -> Path:
    configured = os.environ.get(ROOT_ENV)
    if configured:
        return Path(configured)
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(os.environ.get("TMPDIR", "/tmp"))
    return base / f"clusterctl-{os.getuid()}"


def private_root(root: Path) -> str:
    """'' when `root` is this user's alone (made so when missing), else why not: /dev/shm is every user's.

    A directory another user made, or one others may enter, could hold files
    planted for a restart to load (a snapshot is a pickle): then no snapshot
    is written or read there.
    """
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        found = os.lstat(root)
    except OSError as exc:
        return f"cannot make {root}: {exc.strerror or exc}"
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        return f"{root} is not a directory of this user's alone (mode {stat.S_IMODE(found.st_mode):o}, uid {found.st_uid})"
    return ""


def node_dir(root: Path, run_id: str, node: str) -> Path:
    """One node's files of one run (what the node's server removes at the end of the job)."""
    return root / run_id / node

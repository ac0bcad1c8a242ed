"""Reading and writing the run directory's JSON files so that a reader never sees half a write."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from a file, or None while it is missing, being written, or not an object."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.loads(fh.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def new_file_mode(directory: Path) -> int:
    """The mode to create a file in `directory` with: no bit for a class (group, others) the directory denies
    entry to, and the umask applies to the rest. A run's directory is 0700 (2750 shared with a group:
    rundir/access.py), so a file the user's own shell writes into it (cancel.json, drill.json, under a umask of
    022) is 0600 (0640) as the job's are; in other directories the umask decides."""
    try:
        entry = os.stat(directory).st_mode
    except OSError:
        return 0o600
    mode = 0o666
    if not entry & 0o010:
        mode &= ~0o070
    if not entry & 0o001:
        mode &= ~0o007
    return mode


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that readers see the old or the new file, never a torn one (write, fsync, rename). The new
    file keeps the old one's mode (a run's files are private: rundir/access.py), else takes `new_file_mode`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        mode = new_file_mode(path.parent)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """`data` at `path`, whole or not at all (write, rename; no fsync: for files a crash may lose, never tear), with
    the mode `new_file_mode` gives. The temporary name is the writer's own, thread included."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, new_file_mode(path.parent)), "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise

"""The runs roots this machine's user has submitted into, remembered so that a run is found by its id from anywhere.

A run lives under its runs root: the spec's `runs_root`, the site's, a
submitit executor's folder, or ./runs where `submit` ran. `status local-7`
typed in another directory, or `logs hello-…` for a submitit job, must
still find it, so every submission adds its root to a small list in
$XDG_STATE_HOME/clusterctl/runs-roots (default ~/.local/state/...), newest
first. Remembering is best effort: a read-only home never fails a submit.
"""

from __future__ import annotations

import os
from pathlib import Path

KEEP = 64  # roots remembered; the oldest are forgotten
FILE = "runs-roots"


def state_dir() -> Path:
    """This user's clusterctl state directory ($XDG_STATE_HOME/clusterctl, default ~/.local/state/clusterctl)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser() / "clusterctl"


def remembered() -> list[Path]:
    """The roots submitted into, newest first (whether or not they still exist)."""
    try:
        text = (state_dir() / FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    return [Path(line) for line in text.splitlines() if line.startswith("/")]


def remember(root: Path) -> None:
    """Put `root` first in the list (written whole, then renamed: a crash leaves the old list)."""
    root = root.absolute()
    roots = [root, *(p for p in remembered() if p != root)][:KEEP]
    directory = state_dir()
    tmp = directory / f".{FILE}.{os.getpid()}"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # where this user's runs are: theirs alone
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write("".join(f"{p}\n" for p in roots))
        os.replace(tmp, directory / FILE)
    except OSError:
        tmp.unlink(missing_ok=True)

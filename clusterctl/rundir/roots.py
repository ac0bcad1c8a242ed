"""Runs roots: the one place that says where a job's runs go, where runs are listed and looked up, and which roots
this machine's user has submitted into.

A run lives under its runs root: the spec's `runs_root`, the site's, a
submitit executor's folder, or ./runs where `submit` ran (`of_spec`). `status local-7`
typed in another directory, or `logs hello-…` for a submitit job, must
still find it, so every submission adds its root to a small list in
$XDG_STATE_HOME/clusterctl/runs-roots (default ~/.local/state/...), newest
first. Remembering is best effort: a read-only home never fails a submit.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Iterable
from pathlib import Path

from clusterctl.errors import ConfigError, Problem

KEEP = 64  # roots remembered; the oldest are forgotten
FILE = "runs-roots"
DEFAULT = "runs"  # where neither the spec nor the site names a root: relative to where clusterctl runs
ENV = "CLUSTERCTL_RUNS_ROOTS"  # more roots to look a run up in, os.pathsep-separated
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def expand(text: str) -> tuple[Path | None, str | None]:
    """`~` and `$VARIABLE`s expanded here, relative to the working directory; (None, the first variable that is
    not set) rather than a directory named after it. A login node does this for a laptop (`version --expand`)."""
    env = {"USER": getpass.getuser(), **os.environ}  # a site's per-user root (`/lustre/runs/$USER`) where no shell set it
    unset = [a or b for a, b in _VARIABLE.findall(text) if (a or b) not in env]
    if unset:
        return None, unset[0]
    path = Path(_VARIABLE.sub(lambda m: env[m.group(1) or m.group(2)], text)).expanduser()
    return (path if path.is_absolute() else Path.cwd() / path), None


def chosen(spec_root: str | None, site_root: str | None) -> tuple[str, str]:
    """(the runs root as written, the field it came from): the spec's, else the site's, else ./runs. A laptop's
    submit has the login node expand it there."""
    return str(spec_root or site_root or DEFAULT), "runs_root" if spec_root else "site runs_root"


def of_spec(spec_root: str | None, site_root: str | None) -> Path:
    """A job's runs root (`chosen`), expanded here; an unset variable is an error naming the field rather than a
    directory named after it."""
    root, field = chosen(spec_root, site_root)
    path, unset = expand(root)
    if path is None:
        raise ConfigError("job spec", [Problem(field, root, f"the environment variable {unset} is not set; set it"
                                                                " or write the path out")])
    return path


def listing(given: Path | None) -> Path:
    """Where runs are listed (`runs`, `status` and `suspects` without a run): the root given, else ./runs."""
    return given.expanduser().absolute() if given is not None else Path.cwd() / DEFAULT


def search(given: Path | None, site_roots: Iterable[str]) -> list[Path]:
    """The roots a run named by its id or job is looked up in, in order, each once: the root given alone; else
    $CLUSTERCTL_RUNS_ROOTS, the known sites' roots, the roots submitted into, ./runs."""
    if given is not None:
        return [listing(given)]
    listed = [Path(p).expanduser() for p in os.environ.get(ENV, "").split(os.pathsep) if p]
    sites = [path for path, _unset in map(expand, site_roots) if path is not None]
    ordered, seen = [], set()
    for path in [*listed, *sites, *remembered(), Path.cwd() / DEFAULT]:
        key = os.path.realpath(path.absolute())
        if key not in seen:
            seen.add(key)
            ordered.append(path.absolute())
    return ordered


def state_dir() -> Path:
    """This user's clusterctl state directory ($XDG_STATE_HOME/clusterctl, default ~/.local/state/clusterctl)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser() / "clusterctl"


def remembered() -> list[Path]:
    """The roots submitted into that still exist, newest first (a removed one is forgotten at the next submit)."""
    try:
        text = (state_dir() / FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    return [path for line in text.splitlines() if line.startswith("/") and (path := Path(line)).is_dir()]


def remember(root: Path) -> None:
    """Put `root` first in the list, the roots that no longer exist left out (written whole, then renamed: a crash
    leaves the old list)."""
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

"""Who may read a run: its owner only, or one group too. The one owner of the run directory's modes.

Runs roots live on file systems shared by every user of a cluster, and a run
holds what must not leak: model weights, the code snapshot with its
uncommitted diff, the spec's environment, the attempt's secret. So a run is
private by default, whatever the umask: directories 0700 and files 0600 (an
executable 0700). `runs_mode: group` (with `runs_group`) shares it read-only
with one group: directories 2750 (setgid, so what the job creates inside keeps
the group) and files 0640.

Three places apply it, all from this module:
- `apply` on the run directory as submit assembles it (the files submit writes);
- the batch script's `umask` (`Access.umask`), set before it creates anything,
  so attempt directories, logs, metrics and checkpoints follow;
- the umask sbatch runs with (`submission`): Slurm creates the job's output
  file with the submitting umask.
"""

from __future__ import annotations

import grp
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PRIVATE = "private"
GROUP = "group"
MODES = (PRIVATE, GROUP)


@dataclass(frozen=True)
class Access:
    mode: str = PRIVATE  # private or group
    group: str | None = None  # the sharing group's name (group mode)

    @property
    def umask(self) -> int:
        return 0o077 if self.mode == PRIVATE else 0o027

    @property
    def dir_mode(self) -> int:
        return 0o700 if self.mode == PRIVATE else 0o2750

    def file_mode(self, executable: bool) -> int:
        base = 0o700 if executable else 0o600
        return base if self.mode == PRIVATE else base | (base >> 3) & 0o050

    def gid(self) -> int | None:
        """The sharing group's id; None when private. KeyError when this machine has no such group."""
        return grp.getgrnam(self.group).gr_gid if self.mode == GROUP and self.group else None

    def apply(self, top: Path) -> None:
        """Give `top` and everything under it this access (submit's files; the job's follow the umask).
        The secrets' files stay the owner's only: a group that reads the run does not get them."""
        gid = self.gid()
        secret = owner_only()
        for path in [top, *sorted(top.rglob("*"))]:
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                continue
            if gid is not None:
                os.chown(path, -1, gid)
            if stat.S_ISDIR(info.st_mode):
                os.chmod(path, self.dir_mode)
            else:
                os.chmod(path, 0o600 if path.name in secret else self.file_mode(bool(info.st_mode & 0o100)))


def owner_only() -> frozenset[str]:
    """The names of the files no sharing group reads: the secret_env values, the attempt's token, the rank
    environment a container's wrapper sources (both of them in it) and the key that seals checkpoints."""
    from clusterctl.rundir import layout, secretenv

    return frozenset((secretenv.FILE, layout.TOKEN_FILE, layout.RANK_ENV, layout.CHECKPOINT_KEY))


def of_run(run_path: Path) -> Access | None:
    """A run directory's access, as its run.json records it; None for a directory that is not a run."""
    from clusterctl.rundir import layout, runjson

    if not (run_path / layout.RUN_JSON).is_file():
        return None
    record = runjson.load(run_path)
    return Access(record.runs_mode, record.runs_group)


def submission(script_dir: Path, environ: Mapping[str, str]) -> tuple[int | None, dict[str, str]]:
    """How sbatch is run for the batch script in `script_dir`: with the run's umask (Slurm creates the job's output
    file with it) and `environ` without the run's secret_env names (slurmctld keeps what sbatch hands it), from one
    read of run.json. A script outside a run directory: the caller's umask (None) and `environ` as it is."""
    from clusterctl.rundir import layout, runjson

    if not (script_dir / layout.RUN_JSON).is_file():
        return None, dict(environ)
    record = runjson.load(script_dir)
    secret = set(record.secret_env)
    return Access(record.runs_mode, record.runs_group).umask, {k: v for k, v in environ.items() if k not in secret}


def loose_root(root: Path) -> str | None:
    """A warning when other users can list the runs root (it is never changed: an admin may want it so)."""
    try:
        mode = root.stat().st_mode
    except OSError:
        return None
    if not mode & 0o005:
        return None
    return (f"runs root {root} can be listed by every user ({stat.filemode(mode)}): each run directory in it is"
            f" private, but its name shows; `chmod o-rx {root}` hides them")

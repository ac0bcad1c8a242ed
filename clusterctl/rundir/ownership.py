"""Whose a directory is: the one rule for what clusterctl trusts on a shared file system (pure reads of stat).

A run executes what its directory holds (the wrapper, the secrets file the
batch script exports, the code snapshot), and a resume unpickles DCP's
index from the checkpoint directory. Whoever can write there, or can rename
the directory away and put their own in its place, runs code as the run's
owner. So a runs root, a run directory and a checkpoint directory are
trusted only when

* they are owned by this user and writable by no one else (group mode
  shares read bits only), and
* every directory above them is owned by this user or by root, and is
  writable by no one else unless it is sticky (then others cannot rename
  what is ours in it: /tmp, or a site's root-owned `/lustre/runs` 1777 with
  one 0700 directory per user).

OpenSSH's StrictModes holds ~/.ssh to the same rule. A path that does not
exist yet is judged by its nearest existing parent, which clusterctl would
create it in. The batch script repeats the first half in bash before it
reads anything of the run (templates/job.sbatch.j2, "trust").
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

WRITABLE_BY_OTHERS = 0o022  # group or other may write


def owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _shown(path: Path, info: os.stat_result) -> str:
    return f"{path} (owner {owner_name(info.st_uid)}, {stat.filemode(info.st_mode)})"


def _own_problem(path: Path, info: os.stat_result, uid: int) -> str | None:
    if info.st_uid != uid:
        return (f"{_shown(path, info)} belongs to another user, who could put their own code in it: use a directory"
                f" of your own (one per user under a shared root)")
    if info.st_mode & WRITABLE_BY_OTHERS:
        return (f"{_shown(path, info)} can be written by other users, who could put their own code in it:"
                f" `chmod go-w {path}`")
    return None


def _not_a_directory(path: Path, info: os.stat_result) -> str | None:
    return None if stat.S_ISDIR(info.st_mode) else f"{_shown(path, info)} is not a directory"


def _ancestor_problem(path: Path, info: os.stat_result, uid: int, below: Path) -> str | None:
    if info.st_uid not in (uid, 0):
        return (f"{_shown(path, info)} belongs to another user, who could rename {below} away and put their own in its"
                f" place: use a directory under one that only you (or root) own")
    if info.st_mode & WRITABLE_BY_OTHERS and not info.st_mode & stat.S_ISVTX:
        return (f"{_shown(path, info)} can be written by other users and is not sticky, so they could rename {below}"
                f" away and put their own in its place: `chmod +t {path}` (or `chmod go-w`), or use another directory")
    return None


def untrusted(path: Path, uid: int | None = None) -> str | None:
    """Why `path` (a runs root, run or checkpoint directory) cannot be trusted, or None when it can (module doc)."""
    uid = os.geteuid() if uid is None else uid
    target = Path(os.path.realpath(Path(path).expanduser()))  # a link of ours to a directory of ours is fine
    try:
        info = target.stat()
        problem = _own_problem(target, info, uid) or _not_a_directory(target, info)
    except FileNotFoundError:
        problem = None  # judged by the directories it would be created in
    except OSError as exc:
        return f"{target} cannot be examined ({exc.strerror})"
    if problem:
        return problem
    below = target
    for node in target.parents:
        try:
            info = node.stat()
        except FileNotFoundError:
            below = node
            continue
        except OSError as exc:
            return f"{node} cannot be examined ({exc.strerror})"
        problem = _ancestor_problem(node, info, uid, below)
        if problem:
            return problem
        below = node
    return None

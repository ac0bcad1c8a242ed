"""The controller's open-file limit: one connection per rank must fit under it.

The controller holds one store connection per rank and one watch connection
per node. Many nodes start jobs with a soft limit of 1,024 and a much higher
hard limit: with the soft one, a job of a few thousand ranks saw half its
ranks refused and the controller die with EMFILE before it could write a
verdict. So the controller raises its soft limit to the hard limit first
thing, and when even the hard limit is too small it refuses at once with a
verdict that says what to ask the admin for, instead of failing at the
deadline with nothing written.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

from clusterctl.exitcodes import ExitCode
from clusterctl.rundir.verdict import Verdict

RESERVE = 256  # torch's and libuv's own descriptors, logs, the manifest's temporary file, later process groups
NR_OPEN = Path("/proc/sys/fs/nr_open")  # the ceiling for an "unlimited" hard limit


@dataclass(frozen=True)
class FileLimit:
    soft_before: int
    soft: int  # in force now
    hard: int
    needed: int

    @property
    def enough(self) -> bool:
        return self.soft >= self.needed


def needed_files(world_size: int, nodes: int) -> int:
    """Descriptors the controller needs: a store connection per rank, a watch connection per node, a reserve."""
    return world_size + nodes + RESERVE


def _ceiling(hard: int) -> int:
    if hard != resource.RLIM_INFINITY:
        return hard
    try:
        return int(NR_OPEN.read_text())
    except (OSError, ValueError):
        return 1 << 20  # the kernel's default nr_open


def raise_to_hard(needed: int) -> FileLimit:
    """Raise the soft open-file limit to the hard one (never lower it); report what is in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _ceiling(hard)
    now = soft
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            now = target
        except (ValueError, OSError):
            now = soft
    in_force = _ceiling(now) if now == resource.RLIM_INFINITY else now
    return FileLimit(soft_before=soft, soft=in_force, hard=_ceiling(hard), needed=needed)


def refusal(limit: FileLimit, world_size: int, nodes: int, host: str) -> Verdict:
    """The verdict when the limit cannot hold the job: the numbers, and what to ask for."""
    where = f" on {host}" if host else ""
    message = (
        f"rendezvous refused: the controller{where} may open at most {limit.soft} files (RLIMIT_NOFILE,"
        f" hard limit {limit.hard}), but {world_size} ranks on {nodes} nodes need {limit.needed}"
        f" (one store connection per rank, one per node, {RESERVE} spare). Ask the cluster admin to raise"
        f" the hard open-file limit (nofile) for jobs to at least {limit.needed}: slurmd's LimitNOFILE"
        " (its systemd unit) and /etc/security/limits.conf, which Slurm propagates to the job unless"
        " PropagateResourceLimits leaves NOFILE out"
    )
    evidence = {
        "nofile_soft_at_start": limit.soft_before,
        "nofile_soft": limit.soft,
        "nofile_hard": limit.hard,
        "needed": limit.needed,
        "world_size": world_size,
        "nodes": nodes,
    }
    return Verdict(False, int(ExitCode.RENDEZVOUS_FAILED), message, [], evidence)

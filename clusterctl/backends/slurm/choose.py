"""Which scheduler query this process uses: pyslurm where it works here, else Slurm's commands.

`choose_query()` takes pyslurm when it is installed, its major.minor matches
the running Slurm's (pyslurm 22.5.x for Slurm 22.05.x) and a slurm.conf is
readable (pyslurmprobe.py finds out without risking the process), else the
CLI. `CLUSTERCTL_SLURM_QUERY=cli|pyslurm|auto` forces one; a forced pyslurm
that cannot be used is exit 69 with the reason.
"""

from __future__ import annotations

import os

from clusterctl.backends.slurm import pyslurmprobe
from clusterctl.backends.slurm.cliquery import CliQuery
from clusterctl.backends.slurm.query import SchedulerQuery
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

QUERY_ENV = "CLUSTERCTL_SLURM_QUERY"
CHOICES = ("auto", "cli", "pyslurm")


def choose_query() -> SchedulerQuery:
    """pyslurm where it works here (see the module docstring), else the CLI; CLUSTERCTL_SLURM_QUERY forces one."""
    wanted = (os.environ.get(QUERY_ENV) or "auto").strip().lower()
    if wanted not in CHOICES:
        raise ClusterctlError(f"{QUERY_ENV}={wanted!r}; expected one of: {', '.join(CHOICES)}", ExitCode.USAGE)
    if wanted == "cli":
        return CliQuery()
    problem = pyslurmprobe.problem()
    if problem is None:
        from clusterctl.backends.slurm.pyslurmquery import PyslurmQuery

        try:
            return PyslurmQuery()
        except ClusterctlError as exc:  # the probe's cached answer went stale (libslurm removed, say)
            problem = exc.message
    if wanted == "pyslurm":
        raise ClusterctlError(f"{QUERY_ENV}=pyslurm, but pyslurm cannot be used here: {problem}", ExitCode.BACKEND_UNAVAILABLE)
    return CliQuery()

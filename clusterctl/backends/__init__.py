"""Backends: where a rendered batch script runs. One interface, several transports."""

from __future__ import annotations

from clusterctl.backends.base import Backend, JobInfo, Submission
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

BACKENDS = ("slurm", "local")


def get_backend(name: str) -> Backend:
    """The backend called `name` (slurm, local)."""
    if name == "slurm":
        from clusterctl.backends.slurm.backend import SlurmBackend

        return SlurmBackend()
    if name == "local":
        from clusterctl.backends.local.backend import LocalBackend

        return LocalBackend()
    raise ClusterctlError(f"unknown backend {name!r}; expected one of: {', '.join(BACKENDS)}", ExitCode.USAGE)


__all__ = ["BACKENDS", "Backend", "JobInfo", "Submission", "get_backend"]

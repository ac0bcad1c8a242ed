"""Running Slurm's client commands (sbatch, squeue, scontrol, scancel) and reading their errors.

Every call has a timeout: a hung slurmctld must not hang the user. A command
that is not on PATH, or a controller that does not answer, is exit 69.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

TIMEOUT_S = 60
# Messages that mean "slurmctld is not there", as opposed to "it said no".
UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Socket timed out|Zero Bytes were transmitted|Connection refused"
    r"|Could not establish a configuration source|Communication connection failure",
    re.I,
)


def run(args: list[str], cwd: Path | None = None, umask: int | None = None,
        env: dict[str, str] | None = None, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run one Slurm client command; raise exit 69 when it is missing or does not answer in time. `umask`: the
    command's (sbatch hands its umask to the job: Slurm creates the job's output file with it). Standard library
    only: the batch host runs its calls through here too (batchhost.py)."""
    if shutil.which(args[0]) is None:
        raise ClusterctlError(
            f"{args[0]} is not on PATH: this machine is not a Slurm login node"
            " (use --backend local, or submit from a login node)",
            ExitCode.BACKEND_UNAVAILABLE,
        )
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False,
                              umask=-1 if umask is None else umask, env=env)
    except OSError as exc:
        raise ClusterctlError(f"{args[0]} could not be run: {exc.strerror or exc}", ExitCode.BACKEND_UNAVAILABLE) from None
    except subprocess.TimeoutExpired:
        raise ClusterctlError(
            f"{args[0]} did not answer within {timeout:g} s: the Slurm controller is unreachable or overloaded",
            ExitCode.BACKEND_UNAVAILABLE,
        ) from None


def slurm_reason(stderr: str) -> str:
    """Slurm's own words, without the `sbatch: error:` prefixes."""
    lines = [re.sub(r"^\w+: error: ", "", line).strip() for line in stderr.strip().splitlines()]
    return "; ".join(line for line in lines if line) or "no reason given"


def failure_code(stderr: str, otherwise: ExitCode = ExitCode.BUG) -> ExitCode:
    """Exit 69 when the words say the controller is unreachable, else `otherwise`."""
    return ExitCode.BACKEND_UNAVAILABLE if UNREACHABLE.search(stderr) else otherwise

"""An emulated Slurm on one machine: the engine of the `local` backend.

The local backend runs the *same* rendered batch script that real Slurm
runs. What Slurm would provide around it is emulated here, with the standard
library only (this package runs inside jobs):

    supervisor   one detached process per job: waits for dependencies,
                 allocates emulated nodes, runs `bash SCRIPT` with the batch
                 step's SLURM_* environment, enforces --time and --signal,
                 performs requeue and cancel, records the final state
    srun, scontrol, sbatch, squeue, scancel
                 the client commands, put first on the job's PATH by the
                 executables in bin/ (each execs `python -m` one module here)
    records      the state directory: job records, the job id counter, locks
    batchopts    #SBATCH directives and sbatch's command-line options
    proctree     the job's processes (the supervisor is their subreaper)

Environment variables (names in this module; the state directory's name
is clusterctl.envnames.LOCAL_STATE):

    CLUSTERCTL_LOCAL_STATE       state directory (default ~/.local/state/clusterctl/local)
    CLUSTERCTL_LOCAL_NODES       the emulated nodes as a hostlist (default node[1-4]);
                                 read when a job is submitted
    CLUSTERCTL_LOCAL_TIME_SCALE  real seconds per emulated second (default 1): scales
                                 --time, the --signal lead and srun --wait, so a test
                                 can run a one-minute limit in three seconds with 0.05;
                                 read when a job is submitted
    CLUSTERCTL_LOCAL_PYTHON      set in every job: the interpreter the shims exec
"""

from __future__ import annotations

from pathlib import Path

from clusterctl.envnames import LOCAL_STATE

STATE_ENV = LOCAL_STATE
NODES_ENV = "CLUSTERCTL_LOCAL_NODES"
TIME_SCALE_ENV = "CLUSTERCTL_LOCAL_TIME_SCALE"
PYTHON_ENV = "CLUSTERCTL_LOCAL_PYTHON"

DEFAULT_NODES = "node[1-4]"
DEFAULT_STATE = Path("~/.local/state/clusterctl/local")
CLUSTER_NAME = "local"
DEFAULT_PARTITION = "local"

KILL_WAIT_S = 2.0
"""Slurm's KillWait: seconds between SIGTERM and SIGKILL (real time, never scaled)."""

REQUEUE_DELAY_S = 1.0
"""A requeued job is PENDING (Reason=BeginTime) this long before it runs again (real Slurm: >= 6 s)."""

BIN_DIR = Path(__file__).resolve().parent / "bin"
SUPERVISOR_MODULE = "clusterctl.backends.localslurm.supervisor"

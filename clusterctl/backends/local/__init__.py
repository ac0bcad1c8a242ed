"""An emulated Slurm on one machine: the engine of the `local` backend.

The local backend runs the *same* rendered batch script that real Slurm
runs. What Slurm would provide around it is emulated here, with the standard
library only (this package runs inside jobs):

    supervisor   one detached process per job: waits for dependencies,
                 allocates emulated nodes, runs the batch script with the batch
                 step's SLURM_* environment, enforces --time and --signal,
                 performs requeue and cancel, records the final state
    srun, scontrol, sbatch, squeue, scancel
                 the client commands, put first on the job's PATH by the
                 executables in bin/ (each execs `python -m` one module here
                 with $CLUSTERCTL_LOCAL_PYTHON, the interpreter that submitted)
    srunopts     srun's options and step layout; relay: its output relay
    batchopts    #SBATCH directives and sbatch's command-line options
    control      cancel, signal, requeue, update (jobs; nodes DOWN and RESUME),
                 and what squeue/scontrol show
    records      the state directory: job records, the job id counter, locks,
                 the emulated nodes that are DOWN
    proctree     the job's processes (the supervisor is their subreaper)
    formats      how Slurm writes counts, durations and times

Environment variables (names in this module; the state directory's name
is clusterctl.envnames.LOCAL_STATE):

    CLUSTERCTL_LOCAL_STATE
        state directory (default ~/.local/state/clusterctl/local)
    CLUSTERCTL_LOCAL_NODES
        the emulated nodes as a hostlist (default node[1-4]); read at submit
    CLUSTERCTL_LOCAL_TIME_SCALE
        real seconds per emulated second (default 1): scales --time, the
        --signal lead and srun --wait, so that a test runs a one-minute limit in
        three seconds with 0.05; read at submit. KillWait (2 s) is real time.
    CLUSTERCTL_LOCAL_REQUEUE_DELAY
        real seconds a requeued job stays PENDING (Reason=BeginTime) before it
        runs again (default 1): the window for `scontrol update
        ExcNodeList=...`; read at submit
    CLUSTERCTL_LOCAL_PYTHON
        set in every job: the interpreter the shims exec

Behaviour is pinned to Slurm 22.05 as measured on the test cluster
(tests/slurmlab). Known differences from real Slurm:

* Scheduling: every job starts as soon as its dependencies and begin time
  allow, on the first emulated nodes (in inventory order) not excluded;
  jobs never wait for each other (nodes are shared, --exclusive and CPUs are
  not accounted between jobs), there is no partition, topology (--switches is
  recorded and ignored; --segment, from Slurm 24.05, is checked against
  --nodes and recorded, but no block keeps a segment's nodes together: the
  nodes come in inventory order) or feature model (--constraint is refused), and a
  request for more nodes than exist is refused at submit rather than left
  PENDING. A requeued job waits CLUSTERCTL_LOCAL_REQUEUE_DELAY (1 s; Slurm:
  cred_expire + 1 s and a scheduler pass, 6 s on the test cluster, >= 121 s
  by default).
* Timing: --signal is sent exactly N seconds before the limit and the limit
  is enforced exactly (Slurm checks about every 30 s: the signal and the
  kill may come tens of seconds early or late).
* Nodes are names only: every emulated node is this machine, so %N in srun
  file names is the emulated node name (real Slurm writes the node's host
  name: on the test cluster, where all nodes share one host, %N gives one
  file for all nodes).
* srun: only the options the templates use are accepted (others exit 255 with
  `srun: error: unrecognized option`, where Slurm would accept e.g. pyxis'
  --container-image); stdin of every task is /dev/null; concurrent steps do
  not compete for CPUs (each is checked alone against the job's CPUs per
  node); SLURM_TASK_PID, SLURM_SRUN_COMM_PORT and SLURM_STEP_LAUNCHER_PORT are
  not set; lines longer than 64 KiB are split.
* Output: sbatch's `--output` and srun's per-node files are written by one
  process on this machine (on Slurm by each node's slurmstepd).
* Environment: a job's environment is the submitter's at submit time without
  its SLURM_*/SRUN_* variables (Slurm keeps them and overwrites the ones it
  sets); SLURM_CONF, SLURM_WORKING_CLUSTER, SLURM_TOPOLOGY_ADDR_PATTERN,
  SLURM_NODE_ALIASES and SLURM_PRIO_PROCESS are not set.
* Node failure: `scontrol update NodeName=X State=DOWN Reason=...` marks an
  emulated node DOWN until `State=RESUME` (records.py keeps it in the state
  directory); it stands for a node whose slurmd died, so nothing brings it
  back by itself (on the test cluster, ReturnToService=2 returns a node whose
  slurmd still answers within milliseconds). Jobs see the failure within a
  tick (Slurm: about 25 s after a slurmd dies on the test cluster, minutes on
  a real site). What follows is Slurm's, as measured: a --no-kill job loses
  the node and runs on, srun kills the steps that used it; any other job is
  requeued, or ends NODE_FAIL with --no-requeue (see supervisor.py, srun.py).
  Not measured, chosen here: the batch host failing ends even a --no-kill job
  like a job without it.
* Accounting: job records are kept until the state directory is removed
  (Slurm forgets a job MinJobAge after it ends); there is no sacct.
* A job's processes are its supervisor's descendants (Linux
  PR_SET_CHILD_SUBREAPER), not a cgroup: a process that escapes the tree
  (another session's daemon started through a socket, say) outlives the job.
  If the supervisor itself is killed with SIGKILL, the job shows as NODE_FAIL
  and its processes are left running.
"""

from __future__ import annotations

from pathlib import Path

from clusterctl.envnames import LOCAL_STATE

STATE_ENV = LOCAL_STATE
NODES_ENV = "CLUSTERCTL_LOCAL_NODES"
TIME_SCALE_ENV = "CLUSTERCTL_LOCAL_TIME_SCALE"
REQUEUE_DELAY_ENV = "CLUSTERCTL_LOCAL_REQUEUE_DELAY"
PYTHON_ENV = "CLUSTERCTL_LOCAL_PYTHON"

DEFAULT_NODES = "node[1-4]"
DEFAULT_STATE = Path("~/.local/state/clusterctl/local")
CLUSTER_NAME = "local"
DEFAULT_PARTITION = "local"

KILL_WAIT_S = 2.0
"""Slurm's KillWait: seconds between SIGTERM and SIGKILL (real time, never scaled)."""

REQUEUE_DELAY_S = 1.0
"""By default a requeued job is PENDING (Reason=BeginTime) this long before it runs again."""

BIN_DIR = Path(__file__).resolve().parent / "bin"
SUPERVISOR_MODULE = "clusterctl.backends.local.supervisor"

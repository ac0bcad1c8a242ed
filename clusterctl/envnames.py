"""Environment variable names: the one place that defines them.

The batch script and the wrapper (bash) and the node side (Python) meet
through these names; templates receive them from here rather than spelling
them out.
"""

from __future__ import annotations

# Set by the batch script for the whole attempt.
RUN_DIR = "CLUSTERCTL_RUN_DIR"
ATTEMPT = "CLUSTERCTL_ATTEMPT"
ATTEMPT_DIR = "CLUSTERCTL_ATTEMPT_DIR"
TOKEN = "CLUSTERCTL_TOKEN"
INJECT_TOKEN = "CLUSTERCTL_INJECT_TOKEN"  # the token a drill's injector checks a pid against (never on its command line)
NODES = "CLUSTERCTL_NODES"  # nodes running ranks (allocation minus spares/excluded)
TAKES_OVER = "CLUSTERCTL_TAKES_OVER"  # an elastic run's full-size job: the job whose shrunk attempt it replaces
HOSTFILE = "CLUSTERCTL_HOSTFILE"
OVERSUBSCRIBED = "CLUSTERCTL_OVERSUBSCRIBED"  # 1 where emulated GPUs share real CPUs (runtime/rank/computeclock.py)

# Set by the wrapper for each rank.
NODE_SLOT = "CLUSTERCTL_NODE_SLOT"
GPU = "CLUSTERCTL_GPU"  # physical GPU index on the node
CPUS = "CLUSTERCTL_CPUS"
NUMA = "CLUSTERCTL_NUMA"
NIC = "CLUSTERCTL_NIC"
BIND_TOOL = "CLUSTERCTL_BIND"  # numactl, taskset or none
COORD_PREFIX = "CLUSTERCTL_"  # + TP_RANK, PP_RANK, DP_RANK, CP_RANK, EP_RANK
COORDS = ("tp", "cp", "ep", "dp", "pp")

# Set for ranks when the node runs a heartbeat aggregator (a Unix datagram socket):
# HEARTBEAT_DIR by the batch script (the socket's name follows from token and node),
# HEARTBEAT_SOCKET to name one socket directly (tests, user scripts).
HEARTBEAT_SOCKET = "CLUSTERCTL_HEARTBEAT_SOCKET"
HEARTBEAT_DIR = "CLUSTERCTL_HEARTBEAT_DIR"
WATCH_ADDR = "CLUSTERCTL_WATCH_ADDR"  # host:port where the controller takes the aggregators' batches

# torch.distributed's own names.
TORCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")

# Local backend: the emulated Slurm.
LOCAL_STATE = "CLUSTERCTL_LOCAL_STATE"


def coord_var(axis: str) -> str:
    """`tp` -> `CLUSTERCTL_TP_RANK`."""
    return f"{COORD_PREFIX}{axis.upper()}_RANK"

# Read by each rank's gpu check when the job's groups span nodes over NVLink: where the node's IMEX channel
# devices are (default /dev/nvidia-caps-imex-channels; a site or a test that keeps them elsewhere sets it).
IMEX_CHANNELS = "CLUSTERCTL_IMEX_CHANNELS"

# Warm processes (runtime/node/warm/): set by the batch script when each node runs a process server. WARM names the
# servers (abstract Unix sockets, one per node: WARM + "." + node), WARM_SINCE is when they were (re)started.
# START is set in each rank: "warm ..." when it was forked from its node's server, "cold: <why>" when not.
WARM = "CLUSTERCTL_WARM"
WARM_SINCE = "CLUSTERCTL_WARM_SINCE"
START = "CLUSTERCTL_START"

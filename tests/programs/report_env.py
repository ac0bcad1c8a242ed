"""A stand-in rank: writes what it was given (env, affinity) to the attempt directory."""

import json
import os
import sys

KEYS = [
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "NCCL_IB_HCA", "UCX_NET_DEVICES", "OMP_NUM_THREADS",
    "SLURMD_NODENAME", "SLURM_PROCID", "SLURM_NODEID", "SLURM_JOB_ID", "SLURM_RESTART_COUNT", "USER_VALUE",
]
report = {key: os.environ.get(key) for key in KEYS}
report.update({k: v for k, v in os.environ.items() if k.startswith("CLUSTERCTL_")})
report["affinity"] = sorted(os.sched_getaffinity(0))
report["argv"] = sys.argv[1:]
out = os.path.join(os.environ["CLUSTERCTL_ATTEMPT_DIR"], f"report-{os.environ['RANK']}.json")
with open(out, "w") as fh:
    json.dump(report, fh)
print(f"rank {os.environ['RANK']} reporting from {os.environ.get('SLURMD_NODENAME')}")

#!/bin/bash
# clusterctl rank wrapper for golden-pcie-4gpu: runs once per rank (srun task), binds
# the rank to its GPU, CPUs, NUMA node and NIC from the site's rail map, sets
# the torch.distributed environment, then execs the rank's process.
# Standard tools only: bash, and numactl or taskset when present.
set -u

# Rail map of node type pcie-4gpu, indexed by physical GPU.
GPU_CPUS=('0-7,32-39' '8-15,40-47' '16-23,48-55' '24-31,56-63' )
GPU_NCPUS=(16 16 16 16 )
GPU_NUMA=(0 0 0 0 )
GPU_NICS=('mlx5_0' 'mlx5_0' 'mlx5_0' 'mlx5_0' )
GPU_HCA=('=mlx5_0:1' '=mlx5_0:1' '=mlx5_0:1' '=mlx5_0:1' )
GPU_UCX=('mlx5_0:1' 'mlx5_0:1' 'mlx5_0:1' 'mlx5_0:1' )

fail() { echo "clusterctl wrapper (rank ${SLURM_PROCID:-?} on ${SLURMD_NODENAME:-?}): $*" >&2; exit 80; }
fail_preflight() { echo "clusterctl wrapper (rank ${SLURM_PROCID:-?} on ${SLURMD_NODENAME:-?}): $*" >&2; exit 81; }

rank=${SLURM_PROCID:?not started by srun}
local_rank=${SLURM_LOCALID:?not started by srun}
# The attempt's width: the plan's 2 nodes, or fewer where an elastic job shrank (the batch script's CLUSTERCTL_NODES).
nodes=${CLUSTERCTL_NODES:-2}
[[ "$nodes" =~ ^[1-9][0-9]*$ ]] || fail "CLUSTERCTL_NODES='$nodes' is not a node count"
world=$(( nodes * 4 ))
dp=$(( world / 2 ))
(( ${SLURM_NTASKS:-0} == world )) || fail "srun started ${SLURM_NTASKS:-?} tasks, the attempt has $world ($nodes nodes)"
(( rank / 4 == ${SLURM_NODEID:-0} )) || fail "rank $rank landed on node slot ${SLURM_NODEID:-?}, the plan puts it on slot $(( rank / 4 ))"

# The GPU: entry LOCAL_RANK of what Slurm made visible. The device index to
# expose may be relative (cgroup-constrained devices); the rail map is keyed by
# the physical index, which SLURM_STEP_GPUS / SLURM_JOB_GPUS carry.
IFS=, read -r -a visible <<<"${CUDA_VISIBLE_DEVICES:-}"
IFS=, read -r -a physical <<<"${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}"
if (( ${#visible[@]} > local_rank )); then device=${visible[local_rank]}; else device=$local_rank; fi
if (( ${#physical[@]} > local_rank )); then gpu=${physical[local_rank]}; else gpu=$device; fi
if ! [[ "$gpu" =~ ^[0-9]+$ ]] || (( gpu >= ${#GPU_CPUS[@]} )); then
  fail "GPU '$gpu' is not in the rail map (4 GPUs)"
fi

export RANK=$rank WORLD_SIZE=$world LOCAL_RANK=$local_rank LOCAL_WORLD_SIZE=4 GROUP_RANK=$(( rank / 4 ))
# The rest of what torchrun sets (docs/guide/own-script.md has the table): one role, the run's restarts so far.
# Not TORCHELASTIC_RUN_ID: it would make torch and Lightning take the job for torchrun's (is_torchelastic_launched).
export GROUP_WORLD_SIZE=$nodes ROLE_RANK=$rank ROLE_WORLD_SIZE=$world ROLE_NAME=default
export TORCHELASTIC_RESTART_COUNT=$(( ${CLUSTERCTL_ATTEMPT:-1} - 1 )) TORCHELASTIC_MAX_RESTARTS=3
export CUDA_VISIBLE_DEVICES=$device
export OMP_NUM_THREADS=${GPU_NCPUS[gpu]}
(( OMP_NUM_THREADS > 0 )) || OMP_NUM_THREADS=1
[[ -n "${GPU_HCA[gpu]}" ]] && export NCCL_IB_HCA=${GPU_HCA[gpu]}
export UCX_NET_DEVICES=${GPU_UCX[gpu]}
export CLUSTERCTL_GPU=$gpu CLUSTERCTL_CPUS=${GPU_CPUS[gpu]} CLUSTERCTL_NUMA=${GPU_NUMA[gpu]} CLUSTERCTL_NIC=${GPU_NICS[gpu]} CLUSTERCTL_NODE_SLOT=$(( rank / 4 ))
# Coordinates in the rank order tp-cp-ep-dp-pp (tp fastest).
export CLUSTERCTL_TP_RANK=$(( rank % 2 ))
export CLUSTERCTL_CP_RANK=$(( rank / 2 % 1 ))
export CLUSTERCTL_DP_RANK=$(( rank / 2 % dp ))
export CLUSTERCTL_PP_RANK=$(( rank / (2 * dp) ))
export CLUSTERCTL_EP_RANK=$(( rank / 2 % 1 ))

export NCCL_DEBUG=WARN

cmd=('python3' 'train.py' '--config' 'my config.yaml' )
cpus=${GPU_CPUS[gpu]}
numa=${GPU_NUMA[gpu]}
if command -v numactl >/dev/null 2>&1 && numactl --physcpubind="$cpus" --membind="$numa" true 2>/dev/null; then
  export CLUSTERCTL_BIND=numactl
  exec numactl --physcpubind="$cpus" --membind="$numa" -- "${cmd[@]}"
elif command -v taskset >/dev/null 2>&1; then
  taskset -c "$cpus" true 2>/dev/null ||
    fail_preflight "cannot bind GPU $gpu's rank to CPUs $cpus (this node lacks them: check the site's rail map)"
  export CLUSTERCTL_BIND=taskset
  exec taskset -c "$cpus" "${cmd[@]}"
fi
export CLUSTERCTL_BIND=none  # neither numactl nor taskset: the launcher sets affinity itself
exec "${cmd[@]}"

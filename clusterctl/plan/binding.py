"""Per-GPU binding tables from the site's rail map, and what each rank gets.

The table has one row per local GPU of a node type — not one per rank — so a
102,400-rank job carries 8 rows, and the wrapper finds its row in O(1) from
the GPU Slurm gave it. `rank_env` is the Python statement of what the bash
wrapper computes, used by tests to check the wrapper against the plan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from clusterctl import envnames
from clusterctl.config.site import NodeType
from clusterctl.plan.ranks import RankLayout
from clusterctl.syntax.cpulist import parse_cpulist

IB_KINDS = ("ib", "roce")
VISIBILITY_VAR = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES", "emulated": "CUDA_VISIBLE_DEVICES"}


@dataclass(frozen=True)
class GpuBinding:
    gpu: int
    cpus: str
    ncpus: int
    numa: int
    nics: str  # comma-separated NIC names, best first
    nic_kinds: str  # their kinds (ib, roce, ethernet, ...), same order
    nccl_ib_hca: str  # "" when the GPU has no IB/RoCE NIC
    ucx_net_devices: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def binding_table(node_type: NodeType) -> list[GpuBinding]:
    """Rows indexed by physical GPU index."""
    rows = []
    for gpu in sorted(node_type.gpus, key=lambda g: g.index):
        nics = [node_type.nics[name] for name in gpu.nics]
        hca = [f"{name}:{nic.port}" for name, nic in zip(gpu.nics, nics) if nic.kind in IB_KINDS]
        ucx = [
            f"{name}:{nic.port}" if nic.kind in IB_KINDS else (nic.netdev or name) for name, nic in zip(gpu.nics, nics)
        ]
        rows.append(
            GpuBinding(
                gpu=gpu.index,
                cpus=gpu.cpus or "",
                ncpus=len(parse_cpulist(gpu.cpus)) if gpu.cpus else 0,
                numa=gpu.numa if gpu.numa is not None else 0,
                nics=",".join(gpu.nics),
                nic_kinds=",".join(nic.kind for nic in nics),
                # "=" makes NCCL match names exactly: plain mlx5_1 would also match mlx5_10.
                nccl_ib_hca=("=" + ",".join(hca)) if hca else "",
                ucx_net_devices=",".join(ucx),
            )
        )
    return rows


def rank_env(
    layout: RankLayout,
    gpus_per_node: int,
    table: list[GpuBinding],
    vendor: str,
    rank: int,
    visible: list[int] | None = None,
    physical: list[int] | None = None,
) -> dict[str, str]:
    """The environment the wrapper gives `rank` (torch names, coordinates, binding).

    `visible` is the device list Slurm exposed to the task (CUDA_VISIBLE_DEVICES
    before the wrapper narrows it) and `physical` the node's GPU indices behind
    it (SLURM_STEP_GPUS); the rank takes entry LOCAL_RANK of each.
    """
    local = rank % gpus_per_node
    device = visible[local] if visible and len(visible) > local else local
    gpu = physical[local] if physical and len(physical) > local else device
    row = table[gpu]
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(layout.world),
        "LOCAL_RANK": str(local),
        "LOCAL_WORLD_SIZE": str(gpus_per_node),
        "GROUP_RANK": str(rank // gpus_per_node),
        VISIBILITY_VAR[vendor]: str(device),
        "OMP_NUM_THREADS": str(max(1, row.ncpus)),
        "UCX_NET_DEVICES": row.ucx_net_devices,
        envnames.GPU: str(gpu),
        envnames.CPUS: row.cpus,
        envnames.NUMA: str(row.numa),
        envnames.NIC: row.nics,
        envnames.NODE_SLOT: str(rank // gpus_per_node),
    }
    if row.nccl_ib_hca:
        env["NCCL_IB_HCA"] = row.nccl_ib_hca
    coords = layout.coordinates(rank)
    for axis in envnames.COORDS:
        env[envnames.coord_var(axis)] = str(coords[axis])
    return env

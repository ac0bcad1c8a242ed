"""The traffic map: which groups leave a node, and on which rails.

With block distribution, rank r sits on node r // gpus_per_node, so a group
crosses nodes exactly when its lowest and highest ranks sit on different
nodes. A data-parallel group whose members all use NICs of one rail keeps
its all-reduce on that rail's leaf switches (rail-optimized fabrics); mixed
rails cross the spine.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterctl.config.site import NodeType


@dataclass(frozen=True)
class GroupTraffic:
    kind: str
    size: int
    count: int
    cross_node: int

    def as_dict(self) -> dict[str, int | str]:
        return {"size": self.size, "count": self.count, "cross_node": self.cross_node}


def group_traffic(kind: str, groups: list[list[int]], gpus_per_node: int) -> GroupTraffic:
    crossing = sum(1 for g in groups if min(g) // gpus_per_node != max(g) // gpus_per_node)
    size = len(groups[0]) if groups else 0
    return GroupTraffic(kind, size, len(groups), crossing)


def gpu_rails(node_type: NodeType) -> list[tuple[int, ...]]:
    """Per local GPU index, the rails of its NICs."""
    rails = []
    for gpu in sorted(node_type.gpus, key=lambda g: g.index):
        found = {node_type.nics[n].rail for n in gpu.nics if n in node_type.nics}
        rails.append(tuple(sorted(r for r in found if r is not None)))
    return rails


def group_rails(groups: list[list[int]], rails_by_gpu: list[tuple[int, ...]], gpus_per_node: int) -> list[list[int]]:
    """For each group, the sorted rails its members' NICs are on."""
    out = []
    for group in groups:
        seen: set[int] = set()
        for local in {r % gpus_per_node for r in group}:
            seen.update(rails_by_gpu[local])
        out.append(sorted(seen))
    return out

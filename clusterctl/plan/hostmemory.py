"""What in-memory snapshots cost in host memory, and whether the node has it (pure).

Each rank keeps its own newest KEEP snapshots and its peer's newest KEEP
replicas in its node's tmpfs (checkpoint/snapshots.py): 2 x KEEP copies of
the rank's model and optimizer state, the part of the memory estimate that a
checkpoint holds (parameters and optimizer state; gradients and activations
are not saved). Per node that is gpus_per_node ranks' worth. A snapshot
interval is refused when that exceeds SHARE of the node's host memory
(`host_memory_gb` of its node type), which the data loaders, pinned
buffers and the page cache need too; it is only warned about when the site
does not say how much memory a node has, or the spec gives no model shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterctl.checkpoint.names import SNAPSHOTS_KEPT
from clusterctl.errors import Problem
from clusterctl.plan.memory import MemoryEstimate
from clusterctl.syntax.units import format_gb

KEEP = SNAPSHOTS_KEPT  # checkpoint/snapshots.py keeps this many of each
COPIES = 2 * KEEP  # own snapshots and a peer's replicas
SHARE = 0.5  # of the node's host memory, at most


@dataclass(frozen=True)
class SnapshotCost:
    per_gpu: int  # bytes of host memory per rank
    per_node: int
    host: int | None  # the node's host memory, bytes (None: the site does not say)

    @property
    def fits(self) -> bool | None:
        return None if self.host is None else self.per_node <= self.host * SHARE

    def as_dict(self) -> dict[str, int | bool | None]:
        return {"per_gpu": self.per_gpu, "per_node": self.per_node, "host": self.host, "fits": self.fits}

    def describe(self) -> str:
        host = f" of the node's {format_gb(self.host)}" if self.host is not None else " (the site gives no host_memory_gb)"
        return (f"{format_gb(self.per_gpu)} of host memory per GPU, {format_gb(self.per_node)} per node{host}:"
                f" {KEEP} snapshots and {KEEP} of a peer's replicas per rank")


def snapshot_cost(memory: MemoryEstimate, gpus_per_node: int, host_memory_gb: float | None) -> SnapshotCost:
    per_gpu = COPIES * (memory.params + memory.optimizer)
    host = int(host_memory_gb * 1e9) if host_memory_gb else None
    return SnapshotCost(per_gpu, per_gpu * gpus_per_node, host)


def snapshot_check(interval: int | str, memory: MemoryEstimate | None, gpus_per_node: int, host_memory_gb: float | None,
                   warnings: list[str]) -> tuple[int, SnapshotCost | None, list[Problem]]:
    """`checkpoint.memory_interval` resolved (auto: 1 where it is known to fit, else 0), its cost, a refusal, warnings."""
    if interval == "auto":
        if memory is None or not host_memory_gb:
            return 0, None, []
        cost = snapshot_cost(memory, gpus_per_node, host_memory_gb)
        return (1, cost, []) if cost.fits else (0, None, [])
    assert isinstance(interval, int)
    cost, problems = _checked(interval, memory, gpus_per_node, host_memory_gb, warnings)
    return interval, cost, problems


def _checked(interval: int, memory: MemoryEstimate | None, gpus_per_node: int, host_memory_gb: float | None,
             warnings: list[str]) -> tuple[SnapshotCost | None, list[Problem]]:
    if not interval:
        return None, []
    if memory is None:
        warnings.append("checkpoint.memory_interval: no model shape in the spec, so the snapshots' host memory is unknown")
        return None, []
    cost = snapshot_cost(memory, gpus_per_node, host_memory_gb)
    if cost.fits is None:
        warnings.append(f"checkpoint.memory_interval: the snapshots need {cost.describe()}; set the node type's"
                        " host_memory_gb to have it checked")
        return cost, []
    if not cost.fits:
        return cost, [Problem("checkpoint.memory_interval", interval,
                              f"snapshots that fit in {SHARE:.0%} of the node's host memory; they need {cost.describe()}:"
                              " set 0 (no snapshots), shard the state (sharding) or spread it over more GPUs")]
    return cost, []

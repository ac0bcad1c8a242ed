"""Which step a restore takes from host memory, and who sends whom their state (pure).

One party (rank 0) computes this from one inventory per node, so no rank
receives every rank's inventory: the plan it publishes names only the step
and the transfers, one per rank whose own node lacks its state (a spare
that replaced a lost node). Its size grows with the ranks that need a
transfer, not with the world.

    NodeHeld        rank -> the steps one node holds for it (own snapshots and replicas alike)
    plan_restore    the inventories of every node -> RestorePlan(step, transfers, why)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

NodeHeld = Mapping[int, Iterable[int]]


@dataclass(frozen=True)
class RestorePlan:
    """The step every rank restores (None: the durable checkpoint decides, for `why`) and the transfers it needs."""

    step: int | None
    transfers: tuple[tuple[int, int], ...] = ()  # (sender, receiver): the receiver's own node lacks its state
    why: str = ""

    def to_json(self) -> str:
        return json.dumps({"step": self.step, "transfers": [list(t) for t in self.transfers], "why": self.why},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> RestorePlan:
        """The plan rank 0 published; ValueError for anything that is not one."""
        try:
            raw = json.loads(text)
            step = raw["step"]
            transfers = tuple((int(s), int(d)) for s, d in raw["transfers"])
            why = str(raw.get("why", ""))
        except (TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"not a restore plan: {exc}") from None
        if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
            raise ValueError(f"not a restore plan: step {step!r}")
        return cls(step, transfers, why)


def encode_held(held: Mapping[int, Mapping[int, object] | Iterable[int]]) -> str:
    """One node's inventory as it travels: {"rank": [steps]} (compact; a few ranks' few steps)."""
    return json.dumps({str(r): sorted(s) for r, s in held.items()}, separators=(",", ":"))


def decode_held(text: str | bytes) -> dict[int, tuple[int, ...]]:
    """A node's inventory back; ValueError for anything that is not one."""
    try:
        raw = json.loads(text)
        return {int(r): tuple(int(s) for s in steps) for r, steps in raw.items()}
    except (TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not a snapshot inventory: {exc}") from None


def newest_whole(nodes: Iterable[NodeHeld], world: int) -> int | None:
    """The newest step for which every rank's state is held by some node (linear in the ranks' holdings)."""
    held: dict[int, set[int]] = {}
    for node in nodes:
        for rank, steps in node.items():
            if 0 <= rank < world:
                held.setdefault(rank, set()).update(steps)
    if len(held) < world:
        return None
    common = set.intersection(*held.values()) if held else set()
    return max(common) if common else None


def plan_restore(nodes: Mapping[int, NodeHeld], *, world: int, gpus_per_node: int,
                 durable_step: int | None) -> RestorePlan:
    """The newest step every rank can have, and for each rank whose own node lacks it the rank that sends it.

    Node i runs ranks i*g .. i*g+g-1. The sender is on the node that holds
    the state, at the receiver's local rank: the replica's holder (the next
    node) where it has it, so no rank sends twice after one lost node.
    """
    g = max(1, gpus_per_node)
    step = newest_whole(nodes.values(), world)
    if step is None:
        return RestorePlan(None, why="no step's snapshot is held for every rank")
    if durable_step is not None and step < durable_step:
        return RestorePlan(None, why=f"the durable checkpoint of step {durable_step} is newer than the snapshots' {step}")
    transfers = []
    for rank in range(world):
        own = rank // g
        if step in nodes.get(own, {}).get(rank, ()):
            continue
        holder = ((rank + g) % world) // g
        holding = [n for n in sorted(nodes) if step in nodes[n].get(rank, ())]
        source = holder if holder in holding else holding[0]
        transfers.append((source * g + rank % g, rank))
    return RestorePlan(step, tuple(transfers))

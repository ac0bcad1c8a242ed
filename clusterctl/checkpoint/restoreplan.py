"""Which step a restore takes from host memory, and who sends whom their state (pure).

One party (rank 0) computes this from one inventory per node, so no rank
receives every rank's inventory: the plan it publishes names only the step
and the transfers, one per rank whose own node lacks its state (a spare
that replaced a lost node). Its size grows with the ranks that need a
transfer, not with the world.

    NodeHeld        rank -> the steps one node holds for it (own snapshots and replicas alike)
    plan_restore    the inventories of every node -> RestorePlan(step, transfers, why)
    plan_remapped   the same from another width's snapshots (an elastic shrink or growth: only dp changed)

An inventory also lists the node's snapshots of the run's other widths
(`Width`: their world size, layout and whether their state is the same on
every dp replica), so that a job whose dp changed in its allocation takes
its state from host memory too: each rank takes the snapshot of the saved
rank checkpoint/reshard.py maps it to. That holds for state replicated
across dp (DDP's plain tensors); a state sharded over dp (FSDP's DTensors)
is not remapped and reshards through DCP from the durable checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from clusterctl.checkpoint.reshard import source_rank

NodeHeld = Mapping[int, Iterable[int]]


@dataclass(frozen=True)
class RestorePlan:
    """The step every rank restores (None: the durable checkpoint decides, for `why`) and the transfers it needs."""

    step: int | None
    transfers: tuple[tuple[int, int], ...] = ()  # (sender, receiver): the receiver's own node lacks its state
    why: str = ""
    source: Width | None = None  # the width whose snapshots are restored, where it is not the attempt's own

    def to_json(self) -> str:
        body: dict[str, Any] = {"step": self.step, "transfers": [list(t) for t in self.transfers], "why": self.why}
        if self.source is not None:
            body["source"] = self.source.as_dict()
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> RestorePlan:
        """The plan rank 0 published; ValueError for anything that is not one."""
        try:
            raw = json.loads(text)
            step = raw["step"]
            transfers = tuple((int(s), int(d)) for s, d in raw["transfers"])
            why = str(raw.get("why", ""))
            source = Width.from_dict(raw["source"]) if raw.get("source") is not None else None
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise ValueError(f"not a restore plan: {exc}") from None
        if step is not None and (not isinstance(step, int) or isinstance(step, bool)):
            raise ValueError(f"not a restore plan: step {step!r}")
        return cls(step, transfers, why, source)


@dataclass(frozen=True)
class Width:
    """One width's snapshots (their tag): its world size and layout, and whether every dp replica holds the same state."""

    tag: str
    world: int
    layout: Mapping[str, Any] | None = None
    replicated: bool = False  # no tensor of the state is sharded over dp (no DTensor): any replica's will do

    def as_dict(self) -> dict[str, Any]:
        return {"tag": self.tag, "world": self.world, "layout": dict(self.layout or {}), "replicated": self.replicated}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Width:
        layout = raw.get("layout")
        if layout is not None and not isinstance(layout, Mapping):
            raise ValueError(f"layout {layout!r}")
        return cls(str(raw["tag"]), int(raw["world"]), dict(layout) if layout else None, raw.get("replicated") is True)


@dataclass(frozen=True)
class Inventory:
    """What one node holds: this width's snapshots by rank, and the run's other widths' (`Width`, their ranks)."""

    held: NodeHeld
    others: tuple[tuple[Width, NodeHeld], ...] = field(default=())


def encode_held(held: Mapping[int, Mapping[int, object] | Iterable[int]],
                others: Iterable[tuple[Width, Mapping[int, Mapping[int, object] | Iterable[int]]]] = ()) -> str:
    """One node's inventory as it travels: {"rank": [steps]}, and {"others": [{width, "held": ...}]} where the node
    holds other widths' snapshots (compact; a few ranks' few steps)."""
    body: dict[str, Any] = {str(r): sorted(s) for r, s in held.items()}
    listed = [{**w.as_dict(), "held": {str(r): sorted(s) for r, s in h.items()}} for w, h in others]
    if listed:
        body["others"] = listed
    return json.dumps(body, separators=(",", ":"))


def _held(raw: Mapping[str, Any]) -> dict[int, tuple[int, ...]]:
    return {int(r): tuple(map(int, steps)) for r, steps in raw.items() if r != "others"}


def decode_inventory(text: str | bytes) -> Inventory:
    """A node's inventory back; ValueError for anything that is not one."""
    try:
        raw = json.loads(text)
        others = tuple((Width.from_dict(o), _held(o["held"])) for o in raw.get("others", ()))
        return Inventory(_held(raw), others)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise ValueError(f"not a snapshot inventory: {exc}") from None


def newest_whole(nodes: Iterable[NodeHeld], world: int, needed: Iterable[int] | None = None) -> int | None:
    """The newest step for which the state of every rank (or of every `needed` rank) is held by some node
    (linear in the ranks' holdings)."""
    wanted = set(range(world) if needed is None else needed)
    held: dict[int, set[int]] = {}
    for node in nodes:
        for rank, steps in node.items():
            if rank in wanted:
                held.setdefault(rank, set()).update(steps)
    if len(held) < len(wanted):
        return None
    common = set.intersection(*held.values()) if held else set()
    return max(common) if common else None


def plan_restore(nodes: Mapping[int, NodeHeld], *, world: int, gpus_per_node: int,
                 durable_step: int | None, source: Callable[[int], int] | None = None,
                 saved_world: int | None = None) -> RestorePlan:
    """The newest step every rank can have, and for each rank whose own node lacks it the rank that sends it.

    Node i runs ranks i*g .. i*g+g-1. `source(r)` is the saved rank whose
    state rank r takes (itself, unless another width's snapshots are
    restored; `saved_world` is then theirs). The sender is on the node that
    holds the state, at the receiver's local rank: at the same width the
    replica's holder (the next node) where it has it, so no rank sends twice
    after one lost node.
    """
    g = max(1, gpus_per_node)
    take = source or (lambda r: r)
    wanted = {rank: take(rank) for rank in range(world)}
    step = newest_whole(nodes.values(), saved_world or world, set(wanted.values()))
    if step is None:
        return RestorePlan(None, why="no step's snapshot is held for every rank")
    if durable_step is not None and step < durable_step:
        return RestorePlan(None, why=f"the durable checkpoint of step {durable_step} is newer than the snapshots' {step}")
    transfers = []
    for rank, saved_rank in wanted.items():
        own = rank // g
        if step in nodes.get(own, {}).get(saved_rank, ()):
            continue
        holding = [n for n in sorted(nodes) if step in nodes[n].get(saved_rank, ())]
        if source is None:  # the same width: the replica's holder, the node after the rank's
            holder = ((rank + g) % world) // g
            sender = holder if holder in holding else holding[0]
        else:  # the node indices are this width's: spread the sends over the holding nodes
            sender = holding[rank % len(holding)]
        transfers.append((sender * g + rank % g, rank))
    return RestorePlan(step, tuple(transfers))


def remapper(world: int, layout: Mapping[str, Any] | None, saved: Width) -> Callable[[int], int]:
    """Rank -> the saved rank of `saved` whose state it takes (checkpoint/reshard.py's mapping)."""
    now = dict(layout) if layout else None
    then = dict(saved.layout) if saved.layout else None
    return lambda rank: source_rank(rank, world, now, saved.world, then)


def remappable(layout: Mapping[str, Any] | None, saved: Width) -> str:
    """'' when this width can take `saved`'s snapshots (only dp differs, the state the same on every replica), else why."""
    if not saved.replicated:
        return f"the snapshots of {saved.world} ranks hold state sharded over dp (DTensors): DCP reshards it from the durable checkpoint"
    now, then = dict(layout or {}), dict(saved.layout or {})
    differ = [d for d in ("tp", "cp", "pp", "ep") if int(now.get(d) or 1) != int(then.get(d) or 1)]
    if differ or not now or not then:
        return f"the snapshots of {saved.world} ranks have another model-parallel layout ({', '.join(differ) or 'unknown'})"
    return ""


def plan_remapped(nodes: Mapping[int, Inventory], *, world: int, gpus_per_node: int, layout: Mapping[str, Any] | None,
                  durable_step: int | None) -> RestorePlan:
    """Where no step of this width is whole: the newest one of another width's snapshots that every rank can take
    (the saved rank reshard.py maps it to), when its state is replicated across dp and only dp changed."""
    widths: dict[str, Width] = {}
    for inv in nodes.values():
        for w, _ in inv.others:
            widths.setdefault(w.tag, w)
    best: RestorePlan | None = None
    reasons = []
    for tag, saved in widths.items():
        why = remappable(layout, saved)
        if why:
            reasons.append(why)
            continue
        held = {n: dict(next((h for w, h in inv.others if w.tag == tag), {})) for n, inv in nodes.items()}
        plan = plan_restore(held, world=world, gpus_per_node=gpus_per_node, durable_step=durable_step,
                            source=remapper(world, layout, saved), saved_world=saved.world)
        if plan.step is None:
            reasons.append(f"{saved.world} ranks' snapshots: {plan.why}")
        elif best is None or plan.step > (best.step or -1):
            best = RestorePlan(plan.step, plan.transfers, "", saved)
    if best is not None:
        return best
    return RestorePlan(None, why="; ".join(reasons) or "no step's snapshot is held for every rank")

"""The widths an elastic job may shrink to, planned and checked at submit.

When a verdict excludes a node and no spare is left, an elastic job goes on
in the same allocation on fewer nodes instead of waiting in the queue for a
whole new one (docs/guide/recovery.md, "Elastic"). Every width it may use is
decided here, before anything is submitted, so that a shrink never finds at
run time that a width does not fit:

- whole nodes: the model-parallel group (tp*cp*pp ranks) is kept as it is,
  and data parallelism shrinks by the replicas the lost nodes held, so
  dp' = nodes' x gpus_per_node / (tp*cp*pp) must be whole;
- ep divides dp' x cp, as at full size;
- the batch: `keep` holds the global batch exact by raising gradient
  accumulation (micro stays; a width whose micro x dp' does not divide the
  global batch is not used), `shrink` holds micro x accumulation and lets the
  global batch follow dp';
- the memory estimate, where the spec gives the model: sharded optimizer
  state grows per GPU as dp' shrinks.

Pure: the planner passes the memory estimate as a function of the width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from clusterctl.config.spec import Elastic
from clusterctl.errors import OMIT, Problem
from clusterctl.plan.batch import BatchPlan
from clusterctl.plan.memory import MemoryEstimate

SHOWN_BELOW = 4  # widths under the floor named in a refusal


@dataclass(frozen=True)
class Width:
    """One size the job can train at: its nodes, dp and batch arithmetic, and its memory estimate."""

    nodes: int
    dp: int
    micro: int
    grad_accum: int
    global_batch: int
    memory_gb: float | None  # the estimate per GPU; None without a model shape
    capacity_gb: float | None

    def as_dict(self) -> dict[str, object]:
        return {"nodes": self.nodes, "dp": self.dp, "micro_batch": self.micro, "grad_accum": self.grad_accum,
                "global_batch": self.global_batch, "memory_gb": round(self.memory_gb, 4) if self.memory_gb is not None else None,
                "capacity_gb": self.capacity_gb}


@dataclass(frozen=True)
class ElasticPlan:
    """The smaller widths, largest first, and the node counts in range that cannot be used (with why)."""

    min_nodes: int
    batch: str
    grow: bool
    widths: tuple[Width, ...]
    skipped: tuple[tuple[int, str], ...]

    def as_dict(self) -> dict[str, object]:
        return {"min_nodes": self.min_nodes, "batch": self.batch, "grow": self.grow,
                "widths": [w.as_dict() for w in self.widths],
                "skipped": [{"nodes": n, "why": why} for n, why in self.skipped]}


def default_min_nodes(nodes: int) -> int:
    """Half the job's nodes, rounded up: below that a shrunk job is better off waiting for a whole allocation."""
    return max(1, -(-nodes // 2))


def _min_nodes(settings: Elastic, nodes: int, per_replica_ranks: int, gpn: int) -> tuple[int, list[Problem]]:
    if settings.min_dp is not None:
        return max(1, -(-settings.min_dp * per_replica_ranks // gpn)), []
    if settings.min_nodes is None:
        return default_min_nodes(nodes), []
    if settings.min_nodes >= nodes:
        return nodes, [Problem("elastic.min_nodes", settings.min_nodes,
                               f"expected fewer than nodes = {nodes}: the job shrinks below its {nodes} nodes")]
    return settings.min_nodes, []


def plan_elastic(
    settings: Elastic,
    nodes: int,
    gpus_per_node: int,
    model_parallel: int,
    ep: int,
    cp: int,
    batch: BatchPlan,
    memory_at: Callable[[int, BatchPlan], MemoryEstimate | None],
) -> ElasticPlan | list[Problem]:
    """Every width from nodes - 1 down to the minimum that the job can train at, or the problems that leave none.

    `model_parallel` is tp*cp*pp; `memory_at(dp, batch)` the memory estimate at a width (None without a model).
    """
    dp = batch.dp
    if dp == 1:
        return [Problem("elastic", OMIT, f"needs a data-parallel size above 1 to shrink: tp*cp*pp = {model_parallel}"
                        f" fills all {nodes} nodes (dp = 1), and a pipeline or tensor group cannot lose a node; drop"
                        " elastic, or add nodes so that dp > 1")]
    if settings.min_dp is not None and settings.min_dp >= dp:
        return [Problem("elastic.min_dp", settings.min_dp, f"expected less than dp = {dp}: the job shrinks below it")]
    floor, problems = _min_nodes(settings, nodes, model_parallel, gpus_per_node)
    if problems:
        return problems

    def width(n: int) -> Width | str:
        """The width at n nodes, or why there is none."""
        ranks = n * gpus_per_node
        if ranks % model_parallel:
            return f"not a whole number of tp*cp*pp = {model_parallel} rank groups"
        d = ranks // model_parallel
        if (d * cp) % ep:
            return f"ep = {ep} does not divide dp*cp = {d}*{cp}"
        if settings.batch == "keep":
            if batch.global_batch % (batch.micro * d):
                return f"micro x dp = {batch.micro} x {d} does not divide the global batch {batch.global_batch}"
            shrunk = BatchPlan(batch.micro, batch.global_batch // (batch.micro * d), batch.global_batch, d, batch.seq_len)
        else:
            shrunk = BatchPlan(batch.micro, batch.grad_accum, batch.micro * batch.grad_accum * d, d, batch.seq_len)
        memory = memory_at(d, shrunk)
        if memory is not None and not memory.fits:
            return f"the memory estimate, {memory.total / 1e9:.1f} GB a GPU, does not fit its {memory.capacity / 1e9:.0f} GB"
        return Width(n, d, shrunk.micro, shrunk.grad_accum, shrunk.global_batch,
                     memory.total / 1e9 if memory is not None else None,
                     round(memory.capacity / 1e9, 1) if memory is not None else None)

    widths: list[Width] = []
    skipped: list[tuple[int, str]] = []
    for n in range(nodes - 1, floor - 1, -1):
        found = width(n)
        if isinstance(found, str):
            skipped.append((n, found))
        elif settings.min_dp is None or found.dp >= settings.min_dp:
            widths.append(found)
    if widths:
        return ElasticPlan(floor, settings.batch, settings.grow, tuple(widths), tuple(skipped))
    below = []  # widths under the floor that would do, for the refusal's advice
    for n in range(floor - 1, 0, -1):
        found = width(n)
        if isinstance(found, Width):
            below.append(found)
            if len(below) == SHOWN_BELOW:
                break
    return [_no_width(settings, nodes, floor, skipped, below)]


def grouped(skipped: tuple[tuple[int, str], ...] | list[tuple[int, str]], most: int = 4) -> str:
    """The node counts not used, grouped by why: "15, 14, 13 nodes: ...; 12 nodes: ..."."""
    by_why: dict[str, list[int]] = {}
    for n, why in skipped:
        by_why.setdefault(why, []).append(n)
    shown = [f"{', '.join(map(str, ns[:6]))}{' ...' if len(ns) > 6 else ''} node{'s' if len(ns) > 1 or ns[0] != 1 else ''}:"
             f" {why}" for why, ns in by_why.items()]
    return "; ".join(shown[:most]) + (f" (and {len(shown) - most} more reasons)" if len(shown) > most else "")


def _no_width(settings: Elastic, nodes: int, floor: int, skipped: list[tuple[int, str]], below: list[Width]) -> Problem:
    """Why no width is left between the job's nodes and its floor, and the widths under the floor that would do."""
    field = "elastic.min_dp" if settings.min_dp is not None else "elastic.min_nodes"
    value = settings.min_dp if settings.min_dp is not None else floor
    why = grouped(skipped) or f"no node count from {nodes - 1} down to {floor}"
    if below:
        sizes = ", ".join(f"dp {w.dp} on {w.nodes} node{'s' if w.nodes > 1 else ''}" for w in below)
        why += f". Below it, these widths would do: {sizes}; lower {field} to reach one"
    else:
        why += ". No smaller width would do either"
    if settings.batch == "keep" and any("global batch" in reason for _, reason in skipped):
        why += "; or change batch.global, or use elastic.batch: shrink"
    return Problem(field, value, f"leaves no width the job can shrink to from {nodes} nodes ({why})")

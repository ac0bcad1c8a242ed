"""The ladder's test definition: one versioned description of what every rung's jobs train.

Held fixed across rungs (and recorded in the report), so that a number from
one rung compares with another's: the reference trainer, the spec's model,
micro-batch and accumulation, data parallel only (the reference trainer
implements DDP; the spec's tp/pp/cp/ep are set to 1 and the report says so).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from clusterctl.config.spec import Qualify
from clusterctl.plan.job import PlannedJob

VERSION = 1


@dataclass(frozen=True)
class Definition:
    """What the rungs run: trainer arguments and the spec overrides that make every job the same kind."""

    q: Qualify
    gpus_per_node: int
    max_nodes: int  # nodes the partition offers the ladder (the spec's nodes, at least 2 where there are 2)
    notes: tuple[str, ...] = ()
    base: tuple[str, ...] = field(default=())

    @classmethod
    def of(cls, job: PlannedJob) -> "Definition":
        spec, plan = job.spec, job.plan
        notes = []
        dims = {k: getattr(spec.parallel, k) for k in ("tp", "pp", "cp", "ep")}
        if any(v != 1 for v in dims.values()):
            notes.append("the reference trainer is data parallel: " + ", ".join(f"{k}={v}" for k, v in dims.items() if v != 1)
                         + " set to 1 for every rung")
        partition = job.site.partitions[plan.partition]
        from clusterctl.syntax import hostlist  # noqa: PLC0415

        offered = hostlist.count(partition.nodes) - len(spec.topology.exclude) if partition.nodes else plan.nodes
        base = (
            "parallel.tp=1", "parallel.pp=1", "parallel.cp=1", "parallel.ep=1", "parallel.vpp=1", "parallel.dp=null",
            "batch.global=null", "spares=0", f"gpus_per_node={plan.gpus_per_node}",
        )
        return cls(spec.qualify, plan.gpus_per_node, max(1, min(offered, max(plan.nodes, 2))), tuple(notes), base)

    def trainer(self, steps: int | None = None, *extra: str, target: bool = True) -> list[str]:
        """The reference trainer's command line for `steps` steps (the definition's by default)."""
        argv = ["python3", "-m", "clusterctl.trainer", "--steps", str(steps or self.q.steps),
                "--eval-interval", str(self.q.eval_interval)]
        if target and self.q.target_loss is not None:
            argv += ["--target-loss", str(self.q.target_loss)]
        return argv + list(extra)

    def overrides(self, nodes: int, argv: list[str], *more: str) -> list[str]:
        """`--set` overrides for one job: the fixed base, its size, its command, then the rung's own."""
        return [*self.base, f"nodes={nodes}", "command=" + json.dumps(argv), *more]

    def as_dict(self, job: PlannedJob) -> dict[str, Any]:
        spec = job.spec
        return {
            "version": VERSION,
            "trainer": self.trainer(),
            "model": spec.model.model_dump(exclude_none=True) if spec.model else None,
            "batch": {"micro": job.plan.batch.micro, "grad_accum": job.plan.batch.grad_accum, "seq_len": spec.seq_len},
            "precision": spec.precision.model_dump(exclude_none=True),
            "gpus_per_node": self.gpus_per_node,
            "criteria": self.q.model_dump(),
            "notes": list(self.notes),
        }

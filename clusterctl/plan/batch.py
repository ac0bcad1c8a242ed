"""Batch arithmetic and the pipeline bubble."""

from __future__ import annotations

from dataclasses import dataclass

from clusterctl.errors import OMIT, Problem


@dataclass(frozen=True)
class BatchPlan:
    micro: int
    grad_accum: int
    global_batch: int
    dp: int
    seq_len: int

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq_len


def plan_batch(
    micro: int, global_batch: int | None, grad_accum: int | None, dp: int, seq_len: int
) -> BatchPlan | Problem:
    """global = micro * grad_accum * dp; derive whichever is missing, reject a mismatch."""
    per_accum = micro * dp
    if global_batch is None:
        accum = grad_accum or 1
        return BatchPlan(micro, accum, per_accum * accum, dp, seq_len)
    if grad_accum is None:
        if global_batch % per_accum:
            lo = max(per_accum, global_batch // per_accum * per_accum)
            return Problem(
                "batch.global",
                global_batch,
                f"expected a multiple of micro x dp = {micro} x {dp} = {per_accum} (e.g. {lo} or {lo + per_accum})",
            )
        return BatchPlan(micro, global_batch // per_accum, global_batch, dp, seq_len)
    if micro * grad_accum * dp != global_batch:
        return Problem(
            "batch",
            OMIT,
            f"global ({global_batch}) must equal micro x grad_accum x dp = {micro} x {grad_accum} x {dp}"
            f" = {micro * grad_accum * dp}; give only two of them to derive the third",
        )
    return BatchPlan(micro, grad_accum, global_batch, dp, seq_len)


def bubble_fraction(pp: int, vpp: int, grad_accum: int) -> float:
    """Idle fraction of a 1F1B step: (pp - 1) / (vpp * m + pp - 1)."""
    return (pp - 1) / (vpp * grad_accum + pp - 1)

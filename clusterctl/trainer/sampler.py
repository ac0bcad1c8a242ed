"""A deterministic distributed sampler whose position is global, part of the checkpoint, exact across dp changes.

Each epoch is a permutation of the dataset drawn from (seed, epoch). The
epoch is consumed in order: data-parallel rank r's k-th sample since the
last change of dp is the permutation's id at base + k*dp + r, so the ranks'
partitions are disjoint, every step's samples are a contiguous stretch of
the epoch, and a step of any dp that keeps the global batch takes the same
stretch. The state is the epoch, `base` (the epoch's samples consumed when
dp last changed) and the samples this rank has taken since. A run resumed
under another dp (an elastic shrink, `requeue --set nodes=`) starts its new
base where the saved ranks stopped, so every sample is trained once: none
twice, none skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplerState:
    epoch: int = 0
    position: int = 0  # samples taken by this rank since `base`
    base: int = 0  # the epoch's samples consumed (every rank's) when dp last changed


class DistributedSampler:
    def __init__(self, size: int, dp_rank: int, dp_size: int, seed: int = 0) -> None:
        if size < dp_size:
            raise ValueError(f"dataset of {size} samples is smaller than dp = {dp_size}")
        self.size, self.dp_rank, self.dp_size, self.seed = size, dp_rank, dp_size, seed
        self.state = SamplerState()
        self._perm: torch.Tensor | None = None
        self._perm_epoch = -1

    @property
    def consumed(self) -> int:
        """The epoch's samples every rank together has taken: the global data position."""
        return self.state.base + self.state.position * self.dp_size

    def _permutation(self) -> torch.Tensor:
        if self._perm_epoch != self.state.epoch:
            gen = torch.Generator().manual_seed(self.seed * 7919 + self.state.epoch)
            self._perm = torch.randperm(self.size, generator=gen)
            self._perm_epoch = self.state.epoch
        assert self._perm is not None
        return self._perm

    def take(self, count: int) -> list[int]:
        """The next `count` sample ids of this rank, rolling into the next epoch when a row of dp ids no longer fits
        (the epoch's remainder is dropped, as torch's DistributedSampler(drop_last))."""
        ids: list[int] = []
        while len(ids) < count:
            if self.consumed + self.dp_size > self.size:
                self.state = SamplerState(self.state.epoch + 1)
            perm = self._permutation()
            ids.append(int(perm[self.consumed + self.dp_rank]))
            self.state.position += 1
        return ids

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.state.epoch, "position": self.state.position, "dp_size": self.dp_size,
                "base": self.state.base}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume; under another dp size the new base is where the saved ranks stopped (exact)."""
        position, base = int(state["position"]), int(state.get("base", 0))
        saved_dp = int(state.get("dp_size", self.dp_size))
        if saved_dp != self.dp_size:
            position, base = 0, base + position * saved_dp
        self.state = SamplerState(int(state["epoch"]), position, base)

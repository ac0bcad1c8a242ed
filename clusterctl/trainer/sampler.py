"""A deterministic distributed sampler whose position is part of the checkpoint.

Each epoch is a permutation of the dataset drawn from (seed, epoch); data-
parallel rank r takes every dp-th id of it, starting at r, so the ranks'
partitions are disjoint and cover the epoch. The state is the epoch and the
number of samples this rank has taken, so a resumed run continues with
exactly the ids the uninterrupted run would have used next.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SamplerState:
    epoch: int = 0
    position: int = 0  # samples taken by this rank in this epoch


class DistributedSampler:
    def __init__(self, size: int, dp_rank: int, dp_size: int, seed: int = 0) -> None:
        if size < dp_size:
            raise ValueError(f"dataset of {size} samples is smaller than dp = {dp_size}")
        self.size, self.dp_rank, self.dp_size, self.seed = size, dp_rank, dp_size, seed
        self.per_rank = size // dp_size  # the remainder of an epoch is dropped, as DistributedSampler(drop_last)
        self.state = SamplerState()
        self._perm: torch.Tensor | None = None
        self._perm_epoch = -1

    def _permutation(self) -> torch.Tensor:
        if self._perm_epoch != self.state.epoch:
            gen = torch.Generator().manual_seed(self.seed * 7919 + self.state.epoch)
            self._perm = torch.randperm(self.size, generator=gen)
            self._perm_epoch = self.state.epoch
        assert self._perm is not None
        return self._perm

    def take(self, count: int) -> list[int]:
        """The next `count` sample ids of this rank, rolling into the next epoch as needed."""
        ids: list[int] = []
        while len(ids) < count:
            if self.state.position >= self.per_rank:
                self.state = SamplerState(self.state.epoch + 1, 0)
            perm = self._permutation()
            start = self.state.position * self.dp_size + self.dp_rank
            ids.append(int(perm[start]))
            self.state.position += 1
        return ids

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.state.epoch, "position": self.state.position, "dp_size": self.dp_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume; under another dp size the epoch's consumed share carries over (epoch boundary exact)."""
        position = int(state["position"])
        saved_dp = int(state.get("dp_size", self.dp_size))
        if saved_dp != self.dp_size:
            position = position * saved_dp // self.dp_size
        self.state = SamplerState(int(state["epoch"]), position)

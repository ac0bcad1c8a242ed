"""Synthetic data that a model can learn, generated from (seed, sample id) alone.

Sequences come from a fixed random Markov chain over the vocabulary, so next-
token loss falls from ln(vocab) towards the chain's entropy as the model
learns, and any sample can be regenerated anywhere from its id: no files, no
downloads, and the sample ids a rank consumed say exactly what it saw.
"""

from __future__ import annotations

import torch

HELD_OUT_BASE = 1 << 40  # validation sample ids live far from the training ids


class MarkovTokens:
    """Token sequences from a sparse random transition table (each token has `branching` successors)."""

    def __init__(self, vocab: int, seq_len: int, seed: int = 0, branching: int = 4) -> None:
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed
        gen = torch.Generator().manual_seed(seed)
        self.successors = torch.randint(0, vocab, (vocab, branching), generator=gen)

    def sample(self, sample_id: int) -> torch.Tensor:
        """seq_len + 1 tokens: inputs are [:-1], targets [1:]."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + sample_id)
        choices = torch.randint(0, self.successors.shape[1], (self.seq_len,), generator=gen)
        tokens = torch.empty(self.seq_len + 1, dtype=torch.long)
        tokens[0] = int(torch.randint(0, self.vocab, (1,), generator=gen))
        for i in range(self.seq_len):
            tokens[i + 1] = self.successors[tokens[i], choices[i]]
        return tokens

    def batch(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.stack([self.sample(i) for i in ids])
        return rows[:, :-1], rows[:, 1:]


class Regression:
    """Inputs x ~ N(0, 1) and targets from a fixed random two-layer teacher network plus noise."""

    def __init__(self, features: int, seed: int = 0) -> None:
        self.features, self.seed = features, seed
        gen = torch.Generator().manual_seed(seed)
        self.w1 = torch.randn(features, 4 * features, generator=gen) / features**0.5
        self.w2 = torch.randn(4 * features, 1, generator=gen) / (4 * features) ** 0.5

    def batch(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        xs = []
        for i in ids:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
            xs.append(torch.randn(self.features, generator=gen))
        x = torch.stack(xs)
        y = torch.tanh(x @ self.w1) @ self.w2
        return x, y

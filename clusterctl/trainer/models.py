"""The reference models: a small decoder-only transformer and an MLP."""

from __future__ import annotations

import math

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, ffn), nn.GELU(), nn.Linear(ffn, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(h // self.heads)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        attn = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    """Embeddings, `layers` pre-norm blocks, a tied output head."""

    def __init__(self, vocab: int, seq_len: int, layers: int, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(torch.zeros(seq_len, hidden))
        self.blocks = nn.ModuleList(Block(hidden, heads, ffn) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits, or the next-token loss when targets are given (one call through DDP/FSDP)."""
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.norm(x) @ self.embed.weight.t()
        if targets is None:
            return logits
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


class MLP(nn.Module):
    def __init__(self, features: int, hidden: int, layers: int) -> None:
        super().__init__()
        dims = [features] + [hidden] * layers
        parts: list[nn.Module] = []
        for a, b in zip(dims, dims[1:]):
            parts += [nn.Linear(a, b), nn.GELU()]
        parts.append(nn.Linear(dims[-1], 1))
        self.net = nn.Sequential(*parts)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Predictions, or the mean squared error when targets are given."""
        out = self.net(x)
        return out if targets is None else nn.functional.mse_loss(out.float(), targets)

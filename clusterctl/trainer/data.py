"""Synthetic data that a model can learn, generated from (seed, sample id) alone.

Sequences come from a fixed random Markov chain over the vocabulary, so next-
token loss falls from ln(vocab) towards the chain's entropy as the model
learns, and any sample can be regenerated anywhere from its id: no files, no
downloads, and the sample ids a rank consumed say exactly what it saw.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

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


class TokenShards:
    """A file-backed token dataset: samples of seq_len + 1 tokens in memory-mapped shard files.

    The data path a real run has (files on a shared filesystem, read through the page cache), with
    content a model can learn: the shards hold MarkovTokens samples, written once by one rank
    (`write`) and read by all; held-out ids still come from the generator. `manifest.json` names the
    dataset (generator, seed, sizes, each shard's sha256), which the run record keeps.
    """

    SHARD_SAMPLES = 1024
    MANIFEST = "manifest.json"

    def __init__(self, directory: str | os.PathLike[str], source: MarkovTokens) -> None:
        import numpy as np

        self.directory, self.source = Path(directory), source
        self.manifest = json.loads((self.directory / self.MANIFEST).read_text())
        if (self.manifest["vocab"], self.manifest["seq_len"]) != (source.vocab, source.seq_len):
            raise ValueError(f"{self.directory} holds vocab {self.manifest['vocab']}, seq_len {self.manifest['seq_len']};"
                             f" the run asks for {source.vocab}, {source.seq_len}")
        self.samples = int(self.manifest["samples"])
        width = source.seq_len + 1
        self.shards = [np.memmap(self.directory / s["file"], dtype=np.int32, mode="r", shape=(s["samples"], width))
                       for s in self.manifest["shards"]]
        self.read_s = 0.0  # time spent reading samples: the input wait

    @classmethod
    def write(cls, directory: str | os.PathLike[str], source: MarkovTokens, samples: int) -> None:
        """Generate the shards into a temporary sibling and rename it into place (readers never see half)."""
        import numpy as np

        final = Path(directory)
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        tmp.mkdir(parents=True)
        shards = []
        for first in range(0, samples, cls.SHARD_SAMPLES):
            count = min(cls.SHARD_SAMPLES, samples - first)
            rows = torch.stack([source.sample(first + i) for i in range(count)]).to(torch.int32).numpy()
            name = f"shard-{first // cls.SHARD_SAMPLES:05d}.bin"
            rows.astype(np.int32).tofile(tmp / name)
            shards.append({"file": name, "samples": count, "sha256": hashlib.sha256((tmp / name).read_bytes()).hexdigest()})
        manifest = {"kind": "token shards (clusterctl.trainer.data.TokenShards)", "generator": "MarkovTokens",
                    "seed": source.seed, "vocab": source.vocab, "seq_len": source.seq_len, "samples": samples,
                    "dtype": "int32", "shards": shards}
        (tmp / cls.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        os.rename(tmp, final)

    def drop_cache(self) -> None:
        """Ask the kernel to forget the shards' pages, so the first epoch reads cold."""
        for shard in self.manifest["shards"]:
            fd = os.open(self.directory / shard["file"], os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def batch(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        import numpy as np

        if ids and ids[0] >= HELD_OUT_BASE:
            return self.source.batch(ids)
        began = time.perf_counter()
        rows = [self.shards[i // self.SHARD_SAMPLES][i % self.SHARD_SAMPLES] for i in ids]
        tensor = torch.from_numpy(np.stack(rows).astype(np.int64))
        self.read_s += time.perf_counter() - began
        return tensor[:, :-1], tensor[:, 1:]

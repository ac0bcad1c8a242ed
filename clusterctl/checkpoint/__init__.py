"""Checkpoints as a recovery contract: a generation is resumed from only once it is whole.

    ck = Checkpointer(directory, keep=2, rank=rank, world_size=world)   # collective
    ck.save(step, state, extra)                      # returns after the commit
    handle = ck.save(step, state, extra, asynchronous=True)  # returns after a CPU copy
    gen = ck.latest()                                # newest committed, agreed by all ranks
    extra = ck.load(gen, state)                      # DCP load in place; this rank's extra
    latest_committed(d), list_generations(d), verify(gen_or_path)   # no torch, no ranks

`state` is a DCP state dict (model, optimizer, scaler... may hold DTensors);
`extra` is this rank's small JSON facts (epoch, data position, RNG states).
save, latest and load are collective: every rank calls them in the same order.

Directory layout (one checkpoint directory per run, shared by all nodes):

    <checkpoint dir>/
      step-00000120/                  a committed generation (zero-padded: names sort as steps)
        manifest.json                 step, epoch, data position, every rank's extra (RNG...),
                                      state keys, layout, spec hash, per file: rank, size, crc32
        .metadata                     DCP's index of the state (written by rank 0)
        __0_0.distcp, __1_0.distcp…   one shard file per rank (DCP; optimizer and scaler state inside)
      .tmp-step-00000130-<token>/     a save in progress, or one a crash interrupted
      .trash-step-00000100-<token>/   a generation retention is deleting
      .superseded-step-…-<token>/     set aside by a save of an earlier or equal step (kept)

Commit protocol (protocol.py): shards written in parallel by all ranks into the
temporary directory, each checksummed and fsynced; the manifest written and
fsynced; the directory renamed to `step-N` (the commit) and its parent fsynced.
`latest_committed` only ever returns a `step-N` whose manifest reads and whose
files are all there at their recorded sizes. Retention keeps the newest `keep`
whole committed generations and runs only after a commit, so the newest
committed one is never deleted before a newer one exists. Stale temporaries of
crashed saves are removed by the next successful commit once they cannot be in
flight (this checkpointer's own, or anyone's untouched for `stale_after` s).
Async saves (asyncsave.py) copy the state to reused CPU buffers and commit in
a background thread on the checkpoint's own gloo group; one is in flight at a time.

Resharding (a generation saved under one world size, loaded under another):
- plain (replicated, DDP) tensors load on any number of ranks: each rank reads
  the whole tensor (tested 2 -> 1 and 2 -> 4), and so does a plain
  `optimizer.state_dict()` of a replicated model;
- DTensor state (FSDP2, tensor parallel) is re-cut by DCP for the new mesh
  (tested Shard(0) on 2 ranks -> 4 ranks, and -> 1 process as a plain
  tensor); take optimizer state with `torch.distributed.checkpoint.state_dict.
  get_state_dict` so that it is keyed by name and holds DTensors too;
- per-rank extras (RNG, data position) are mapped as `reshard.py` says: same
  rank when the world is unchanged; when only dp changed, same tp/cp/pp
  coordinates and dp rank `dp % saved_dp`; otherwise saved rank
  `rank % saved_world_size`. A rank new to the world borrows a peer's RNG
  state, so re-derive RNG from (seed, step, rank) after a change.
Not supported: torch's older ShardedTensor (FSDP1) state in async saves.
Trust (trust.py): loading unpickles DCP's index, so `latest_committed` returns only a generation that is
this user's alone and whose manifest carries this user's seal (an HMAC with the key in
$XDG_STATE_HOME/clusterctl); `refusal` says why the newest whole one is not, and `clusterctl checkpoints
DIR --adopt` (adoption.py) verifies and seals one written before seals or copied in.
Listing, `latest_committed` and `verify` import no torch (login nodes have none).
"""

from __future__ import annotations

from typing import Any

from clusterctl.checkpoint.errors import CheckpointError
from clusterctl.checkpoint.generations import Generation, GenerationInfo, latest_committed, list_generations
from clusterctl.checkpoint.verify import verify

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "Generation",
    "GenerationInfo",
    "SaveHandle",
    "latest_committed",
    "list_generations",
    "verify",
]


def __getattr__(name: str) -> Any:
    # The saving side needs torch; listing, latest and verify (login nodes, CLI) must not.
    if name == "Checkpointer":
        from clusterctl.checkpoint.checkpointer import Checkpointer

        return Checkpointer
    if name == "SaveHandle":
        from clusterctl.checkpoint.asyncsave import SaveHandle

        return SaveHandle
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

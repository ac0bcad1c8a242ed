"""`Checkpointer`: the API a training loop uses (save, wait, latest, load, close).

Every method but `wait` and `close` is collective over the checkpoint's
ranks: every rank calls it, in the same order. A Checkpointer makes its own
gloo process group (over the ranks of `process_group`, default the whole
world) so that its collectives, including those of a background save, never
interleave with the training group's; only the ranks of that group need to
construct it. The group connects lazily: a rank opens a connection only to
the peers it exchanges with, so its sockets do not grow with the world
(`_checkpoint_group`).
"""

from __future__ import annotations

import copy
import os
import secrets
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException

from clusterctl.checkpoint import asyncsave, protocol, reshard
from clusterctl.checkpoint.asyncsave import SaveHandle, Stager
from clusterctl.checkpoint.errors import CheckpointError
from clusterctl.checkpoint.generations import Generation, resumable
from clusterctl.checkpoint.protocol import Context, Timings, save_generation

LAZY_GLOO = "TORCH_GLOO_LAZY_INIT"  # read by gloo as a group is made: connect each pair on its first exchange


def _checkpoint_group(rank: int, world_size: int, process_group: Any, timeout: timedelta) -> Any:
    """A gloo group over the training group's ranks, or None for a single process.

    Made eagerly, a gloo group connects a full mesh on every attempt: world - 1
    sockets on every rank, 10^10 connections at 100,000 ranks. Made lazily, a
    rank connects only to whom it exchanges with: its ring neighbours for the
    all-reduce, and the coordinator (rank 0) for DCP's gathers and broadcasts,
    which alone holds one connection a rank (tests/test_checkpoint.py counts
    them). The variable is set only while this group is made; the script's own
    groups are made as it asks.
    """
    if world_size == 1:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        raise CheckpointError(f"world_size {world_size} needs torch.distributed initialised first")
    if process_group is not None:
        ranks = dist.get_process_group_ranks(process_group)
    else:
        ranks = list(range(dist.get_world_size()))
    if len(ranks) != world_size:
        raise CheckpointError(f"world_size {world_size} but the process group has {len(ranks)} ranks")
    before = os.environ.get(LAZY_GLOO)
    os.environ[LAZY_GLOO] = "1"
    try:
        group = dist.new_group(ranks=ranks, backend="gloo", timeout=timeout, use_local_synchronization=True)
    finally:
        if before is None:
            os.environ.pop(LAZY_GLOO, None)
        else:
            os.environ[LAZY_GLOO] = before
    if dist.get_rank(group) != rank:
        raise CheckpointError(f"rank {rank} is rank {dist.get_rank(group)} of the process group")
    return group


class Checkpointer:
    """Saves and loads committed generations in one directory (see the package docstring)."""

    def __init__(
        self,
        directory: str | Path,
        *,
        keep: int = 2,
        rank: int,
        world_size: int,
        process_group: Any = None,
        spec_hash: str = "",
        layout: dict[str, Any] | None = None,
        stale_after: float = 600.0,
        pin_memory: bool | None = None,
        timeout: timedelta = timedelta(minutes=30),
    ) -> None:
        if keep < 1:
            raise CheckpointError(f"keep must be at least 1 (the newest committed generation), got {keep}")
        if not 0 <= rank < world_size:
            raise CheckpointError(f"rank {rank} outside world_size {world_size}")
        self.directory = Path(directory)
        self.rank, self.world_size = rank, world_size
        self.layout = layout
        group = _checkpoint_group(rank, world_size, process_group, timeout)
        self.directory.mkdir(parents=True, exist_ok=True)
        owner = secrets.token_hex(4) if rank == 0 else None
        if group is not None:
            box = [owner]
            dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
            owner = box[0]
        assert owner is not None
        self._ctx = Context(
            directory=self.directory,
            rank=rank,
            world_size=world_size,
            group=group,
            keep=keep,
            owner=owner,
            spec_hash=spec_hash,
            layout=layout,
            stale_after=stale_after,
        )
        self._seq = 0
        self._stager = Stager(pin_memory)
        self._inflight: SaveHandle | None = None
        self._closed = False

    # --- saving ---------------------------------------------------------------------------
    def save(
        self, step: int, state: dict[str, Any], extra: dict[str, Any], *, asynchronous: bool = False
    ) -> SaveHandle:
        """Save `state` (DCP) and this rank's `extra` (JSON) as generation `step`; collective.

        Synchronous: returns once committed. Asynchronous: returns once the state
        is copied; `handle.wait()` gives the Generation. An earlier async save is
        waited for first, and its failure is raised here.
        """
        self._check_open()
        if step < 0:
            raise CheckpointError(f"step must be >= 0, got {step}")
        self.wait()
        self._seq += 1
        token = f"{self._ctx.owner}-{self._seq}"
        if not asynchronous:
            generation, timings = save_generation(self._ctx, step, state, copy.deepcopy(extra), token, "sync")
            return SaveHandle.completed(generation, timings)
        try:
            staged, stage_s = asyncsave.stage_timed(self._stager, state)
            problem = None
        except Exception as exc:  # noqa: BLE001 - every rank must learn of it before the background save
            staged, stage_s, problem = None, 0.0, f"rank {self.rank}: staging failed: {type(exc).__name__}: {exc}"
        if not self._all_agree(problem is None):
            raise CheckpointError(f"checkpoint of step {step} not started: {problem or 'staging failed on another rank'}")
        staged_extra = copy.deepcopy(extra)
        timings = Timings(stage=stage_s)
        self._inflight = asyncsave.start_background(
            step, timings, lambda: save_generation(self._ctx, step, staged, staged_extra, token, "async")
        )
        return self._inflight

    def wait(self) -> Generation | None:
        """Wait for the in-flight async save; its Generation, or None when none was in flight.

        A failed save raises its CheckpointError here unless `handle.wait()` already did.
        """
        handle, self._inflight = self._inflight, None
        if handle is None:
            return None
        already_reported = handle.error_reported
        try:
            return handle.wait()
        except CheckpointError:
            if already_reported:
                return None
            raise

    def _all_agree(self, ok: bool) -> bool:
        """Whether `ok` holds on every rank (one tiny all-reduce on the checkpoint group)."""
        if self._ctx.group is None:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._ctx.group)
        return bool(flag.item())

    # --- resuming -------------------------------------------------------------------------
    def latest(self) -> Generation | None:
        """The newest committed generation, as rank 0 sees it (so that every rank agrees); collective.
        CheckpointError on every rank when the newest whole one is not this user's to load (trust.py)."""
        self._check_open()
        self.wait()
        found = resumable(self.directory) if self.rank == 0 else (None, None)
        if self._ctx.group is not None:
            box = [found]
            dist.broadcast_object_list(box, src=dist.get_global_rank(self._ctx.group, 0), group=self._ctx.group)
            found = box[0]
        generation, refused = found
        if refused:  # the same error on every rank: the script's, no node is blamed (runtime/controller/blame.py)
            raise CheckpointError(refused)
        return generation

    def load(self, generation: Generation, state: dict[str, Any]) -> dict[str, Any]:
        """Load `generation` into `state` in place (DCP reshards); this rank's extra (reshard.py); collective."""
        self._check_open()
        self.wait()
        try:
            protocol.dcp_quietly(
                dcp.load,
                state,
                storage_reader=FileSystemReader(generation.path),
                process_group=self._ctx.group,
                no_dist=self._ctx.group is None,
            )
        except (Exception, CheckpointException) as exc:
            raise CheckpointError(f"loading {generation.path} failed: {protocol.describe(exc)}") from exc
        return copy.deepcopy(reshard.map_extra(generation.manifest, self.rank, self.world_size, self.layout))

    # --- lifetime -------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for an in-flight save, then release the checkpoint's process group."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            if self._ctx.group is not None:
                dist.destroy_process_group(self._ctx.group)
                self._ctx.group = None

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError("this Checkpointer is closed")

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

"""The commit protocol: one save of one generation, run by every rank.

1. Every rank writes its shard of the DCP state into `.tmp-step-N-<token>/`
   (DCP plans who writes what; replicated tensors are written once, spread
   over ranks); each file is checksummed as written and fsynced; the
   coordinator writes DCP's `.metadata` the same way.
2. Every rank sends its files' sizes and checksums and its extra (or its
   error) to the coordinator in one gather.
3. The coordinator writes `manifest.json` and fsyncs it, fsyncs the
   temporary directory, moves aside any committed generation of the same or
   a later step (a rewound run's abandoned future), renames the temporary
   directory to `step-N` (the commit) and fsyncs the parent directory.
4. The coordinator applies retention, then broadcasts the outcome; every rank
   returns the same generation or raises the same error.

A crash anywhere before the rename leaves only a temporary directory, which
`latest_committed` never returns; after it, the generation is whole.
All collectives run on the checkpoint's own process group.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from clusterctl import envnames
from clusterctl.checkpoint import durable, names, phases, retention, trust
from clusterctl.checkpoint import manifest as manifest_mod
from clusterctl.checkpoint.checksums import ShardDigest
from clusterctl.checkpoint.errors import CheckpointError
from clusterctl.checkpoint.generations import Generation, committed_steps
from clusterctl.checkpoint.shards import ChecksummingWriter


@dataclass
class Context:
    """What every save of one checkpointer shares."""

    directory: Path
    rank: int
    world_size: int
    group: Any  # the checkpoint's gloo process group, None in a single process
    keep: int
    owner: str  # random prefix of this checkpointer's tokens: its temporaries are known dead
    spec_hash: str
    layout: dict[str, Any] | None
    stale_after: float
    thread_count: int = 1


@dataclass
class Timings:
    """Seconds spent in each part of a save, as this rank saw them."""

    stage: float = 0.0  # async only: copying the state to CPU buffers (the visible pause)
    write: float = 0.0  # DCP planning + shard writes, checksums and fsyncs
    gather: float = 0.0  # sizes, checksums and extras to the coordinator
    commit: float = 0.0  # manifest, fsyncs, rename (coordinator)
    retention: float = 0.0  # deleting old generations (coordinator)
    total: float = 0.0  # write through the outcome broadcast
    removed: list[str] = field(default_factory=list)  # what retention deleted (coordinator)
    retention_error: str | None = None  # retention failed; the commit stands and the next save retries


def describe(exc: BaseException) -> str:
    """One line per failing rank for DCP's exception (whose str is every rank's traceback)."""
    if isinstance(exc, CheckpointException):
        parts = []
        for rank, failure in sorted(exc.failures.items()):
            inner = failure[0] if isinstance(failure, tuple) else failure
            parts.append(f"DCP rank {rank}: {type(inner).__name__}: {inner}")
        return "; ".join(parts)
    return f"{type(exc).__name__}: {exc}"


def dcp_quietly(call: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a DCP save/load; in a single process, without DCP's "assuming one process" warning.

    (catch_warnings is process-wide: harmless here, the one process is the only saver.)
    """
    if not kwargs.get("no_dist"):
        return call(*args, **kwargs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        return call(*args, **kwargs)


def _extra_problem(rank: int, extra: Any) -> str | None:
    """Why `extra` would not come back from the manifest as it was given (None when it would)."""
    if not isinstance(extra, dict):
        return f"rank {rank}: extra must be a dict, got {type(extra).__name__}"
    try:
        back = json.loads(json.dumps(extra))
    except (TypeError, ValueError) as exc:
        return f"rank {rank}: extra is not JSON-serialisable: {exc}"
    if back != extra:
        return f"rank {rank}: extra does not survive JSON unchanged (tuples or non-str keys?)"
    return None


def _gather(ctx: Context, item: Any) -> list[Any]:
    if ctx.group is None:
        return [item]
    out: list[Any] = [None] * ctx.world_size if ctx.rank == 0 else []
    dist.gather_object(item, out if ctx.rank == 0 else None, dst=dist.get_global_rank(ctx.group, 0), group=ctx.group)
    return out


def _broadcast(ctx: Context, item: Any) -> Any:
    if ctx.group is None:
        return item
    box = [item]
    dist.broadcast_object_list(box, src=dist.get_global_rank(ctx.group, 0), group=ctx.group)
    return box[0]


def _write_shards(ctx: Context, tmp: Path, step: int, state: dict[str, Any]) -> list[ShardDigest]:
    writer = ChecksummingWriter(tmp, step=step, thread_count=ctx.thread_count)
    dcp_quietly(dcp.save, state, storage_writer=writer, process_group=ctx.group, no_dist=ctx.group is None)
    return writer.digests


def commit(directory: Path, tmp: Path, step: int, token: str, manifest: dict[str, Any]) -> Path:
    """Coordinator only: manifest (sealed with the run's key: trust.py), fsyncs, rename. Returns the committed path.

    The seal is added to `manifest` in place, so the caller's Generation carries exactly what was written.
    (Also the last part of a framework's save: checkpoint/filesets.py.)
    """
    run_dir = os.environ.get(envnames.RUN_DIR)
    manifest.update(trust.sign(manifest, trust.run_key(), Path(run_dir).name if run_dir else None))
    manifest_mod.write(tmp, manifest)
    phases.enter(phases.DIR_FSYNC, step)
    durable.fsync_dir(tmp)
    final = directory / names.committed(step)
    for later in [s for s in committed_steps(directory) if s >= step]:
        os.rename(directory / names.committed(later), directory / names.superseded(later, token))
    phases.enter(phases.RENAME, step)
    os.rename(tmp, final)
    phases.enter(phases.COMMITTED, step)
    phases.enter(phases.PARENT_FSYNC, step)
    durable.fsync_dir(directory)
    return final


def save_generation(
    ctx: Context, step: int, state: dict[str, Any], extra: dict[str, Any], token: str, mode: str
) -> tuple[Generation, Timings]:
    """Write, commit and prune one generation; collective over the context's group."""
    timings = Timings()
    t0 = time.perf_counter()
    tmp = ctx.directory / names.temporary(step, token)
    error: str | None = None
    digests: list[ShardDigest] = []
    # Every rank must reach every collective below, so local failures travel as values.
    try:
        digests = _write_shards(ctx, tmp, step, state)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001 - reported through the gather, raised below
        where = "" if isinstance(exc, CheckpointException) else f"rank {ctx.rank}: "  # DCP names the ranks
        error = f"{where}writing shards failed: {describe(exc)}"
    if error is None:
        error = _extra_problem(ctx.rank, extra)
    t1 = time.perf_counter()
    gathered = _gather(ctx, (digests, extra if error is None else None, error))
    t2 = time.perf_counter()

    outcome: tuple[str, Any]
    if ctx.rank == 0:
        errors = list(dict.fromkeys(e for _, _, e in gathered if e))
        if errors:
            shutil.rmtree(tmp, ignore_errors=True)
            outcome = ("error", "; ".join(errors))
        else:
            try:
                manifest = manifest_mod.build(
                    step=step,
                    token=token,
                    mode=mode,
                    extras=[x for _, x, _ in gathered],
                    digests=[d for d, _, _ in gathered],
                    state_keys=state.keys(),
                    layout=ctx.layout,
                    spec_hash=ctx.spec_hash,
                )
                final = commit(ctx.directory, tmp, step, token, manifest)
                outcome = ("ok", (str(final), manifest))
            except Exception as exc:  # noqa: BLE001 - every rank must hear about it
                shutil.rmtree(tmp, ignore_errors=True)
                outcome = ("error", f"rank 0: committing step {step} failed: {type(exc).__name__}: {exc}")
        t3 = time.perf_counter()
        timings.commit = t3 - t2
        if outcome[0] == "ok":
            try:
                timings.removed = retention.prune(
                    ctx.directory,
                    keep=ctx.keep,
                    committed_step=step,
                    current_token=token,
                    owner=ctx.owner,
                    stale_after=ctx.stale_after,
                )
            except Exception as exc:  # noqa: BLE001 - the commit stands; the next save retries
                timings.retention_error = f"{type(exc).__name__}: {exc}"
        timings.retention = time.perf_counter() - t3
    else:
        outcome = ("pending", None)
    outcome = _broadcast(ctx, outcome)
    timings.write, timings.gather = t1 - t0, t2 - t1
    timings.total = time.perf_counter() - t0
    if outcome[0] != "ok":
        raise CheckpointError(f"checkpoint of step {step} not committed: {outcome[1]}")
    path, manifest = outcome[1]
    return Generation(step, Path(path), manifest), timings

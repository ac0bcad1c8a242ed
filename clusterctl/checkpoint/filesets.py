"""Generations made of the files a framework writes: Lightning's `.ckpt`, the Hugging Face Trainer's folder.

A framework saves its own way (its own state: loops, schedulers, callbacks,
RNG); this module gives those files the commit protocol the Checkpointer's
DCP shards get, so `clusterctl checkpoints` lists them, `verify` checks them
and a resume takes the newest committed one:

1. the files are put into `.tmp-step-N-<token>/` (`fill` writes or moves them there);
2. each is checksummed and fsynced, and listed in the manifest with its size
   and checksum (`mode: files:<framework>`; it has no DCP index);
3. `protocol.commit`: manifest written and fsynced, directory fsynced, renamed
   to `step-N`, parent fsynced;
4. retention keeps the newest `keep` whole generations.

One process commits (rank 0), once every rank's files are in place: the
adapters (integrations/) bring the ranks together around it. A failure
before the rename leaves a temporary that the next commit clears.
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import Any, Callable

from clusterctl.checkpoint import durable, names, protocol, retention
from clusterctl.checkpoint import manifest as manifest_mod
from clusterctl.checkpoint.checksums import ShardDigest, file_checksum
from clusterctl.checkpoint.generations import Generation

STALE_AFTER_S = 600.0  # another writer's temporary untouched this long is a crashed save's


def _seal(root: Path, path: Path) -> ShardDigest:
    """Checksum and fsync one file the framework wrote."""
    size, checksum = file_checksum(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return ShardDigest(path.relative_to(root).as_posix(), size, checksum)


def move_into(source: Path) -> Callable[[Path], None]:
    """A `fill` that moves a folder's contents (a framework's finished checkpoint folder) into the generation."""

    def fill(tmp: Path) -> None:
        for entry in sorted(source.iterdir()):
            shutil.move(str(entry), str(tmp / entry.name))
        source.rmdir()

    return fill


def commit_files(
    directory: Path,
    step: int,
    fill: Callable[[Path], None],
    *,
    framework: str,
    keep: int,
    world_size: int,
    extra: dict[str, Any] | None = None,
    spec_hash: str = "",
    layout: dict[str, Any] | None = None,
    owner: str | None = None,
) -> Generation:
    """Commit the files `fill(tmp)` puts into a temporary generation as `step-N`; coordinator only.

    `owner` prefixes this writer's tokens, so that retention knows its own
    earlier temporaries to be dead; `extra` is what the manifest records for
    the step (epoch, data position...).
    """
    directory.mkdir(parents=True, exist_ok=True)
    owner = owner or secrets.token_hex(4)
    token = f"{owner}-{secrets.token_hex(3)}"
    tmp = directory / names.temporary(step, token)
    tmp.mkdir()
    try:
        fill(tmp)
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        digests = [_seal(tmp, p) for p in files]
        for sub in sorted({p.parent for p in files if p.parent != tmp}, key=lambda p: -len(p.parts)):
            durable.fsync_dir(sub)
        manifest = manifest_mod.build(
            step=step,
            token=token,
            mode=manifest_mod.FILES_MODE + framework,
            extras=[extra or {}],
            digests=[digests],
            state_keys=sorted({d.name.split("/")[0] for d in digests}),
            layout=layout,
            spec_hash=spec_hash,
            world_size=world_size,
        )
        final = protocol.commit(directory, tmp, step, token, manifest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    retention.prune(directory, keep=keep, committed_step=step, current_token=token, owner=owner, stale_after=STALE_AFTER_S)
    return Generation(step, final, manifest)

"""The manifest: what a committed generation holds, and how to check it is whole.

`manifest.json` is written last into the temporary generation and fsynced
before the rename that commits it, so a committed generation always has one.
It records the step, the global facts (epoch, data position: taken from rank
0's extra), every rank's extra (RNG states, sampler position, scaler...), the
top-level keys of the DCP state (model, optimizer, scaler...), the parallel
layout and spec hash the job ran with, and per file the rank that wrote it,
its size and its checksum.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterable

from clusterctl.checkpoint import durable, names, phases
from clusterctl.checkpoint.checksums import ShardDigest

FORMAT = "clusterctl-checkpoint/1"
# `mode` of a generation whose files a framework wrote (filesets.py): "files:lightning", "files:hf".
# Such a generation has no DCP index; the Checkpointer's own are "sync" or "async".
FILES_MODE = "files:"


class ManifestError(Exception):
    """A manifest that is missing, unreadable or not ours."""


def _global_fact(extra: dict[str, Any], key: str, sampler_key: str) -> Any:
    """`epoch`/`data_position` from rank 0's extra, or from a nested `sampler` state."""
    if key in extra:
        return extra[key]
    sampler = extra.get("sampler")
    if isinstance(sampler, dict):
        return sampler.get(sampler_key)
    return None


def build(
    *,
    step: int,
    token: str,
    mode: str,
    extras: list[dict[str, Any]],
    digests: list[list[ShardDigest]],
    state_keys: Iterable[str],
    layout: dict[str, Any] | None,
    spec_hash: str,
    world_size: int | None = None,
) -> dict[str, Any]:
    """The manifest of one generation; `extras` and `digests` are indexed by rank.

    `world_size` defaults to one rank per extra; a framework's files (filesets.py) come from
    one writer for a larger world.
    """
    import torch

    shards: dict[str, dict[str, Any]] = {}
    for rank, rank_digests in enumerate(digests):
        for d in rank_digests:
            shards[d.name] = {"rank": rank, "size": d.size, "checksum": d.checksum}
    first = extras[0] if extras else {}
    return {
        "format": FORMAT,
        "step": step,
        "epoch": _global_fact(first, "epoch", "epoch"),
        "data_position": _global_fact(first, "data_position", "position"),
        "world_size": len(extras) if world_size is None else world_size,
        "layout": layout or {},
        "spec_hash": spec_hash,
        "mode": mode,
        "token": token,
        "created": round(time.time(), 3),
        "torch": torch.__version__,
        "state_keys": sorted(state_keys),
        "shards": dict(sorted(shards.items())),
        "ranks": extras,
    }


def write(directory: Path, manifest: dict[str, Any]) -> None:
    """Write and fsync the manifest into a (temporary) generation directory."""
    data = json.dumps(manifest, indent=1, sort_keys=False).encode() + b"\n"
    durable.write_file(
        directory / names.MANIFEST,
        data,
        step=int(manifest["step"]),
        write_phase=phases.MANIFEST_WRITE,
        fsync_phase=phases.MANIFEST_FSYNC,
    )


def read(directory: Path) -> dict[str, Any]:
    """The manifest of a generation directory; ManifestError when missing or malformed."""
    path = directory / names.MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ManifestError(f"{path}: no manifest") from None
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ManifestError(f"{path}: not a {FORMAT} manifest")
    for key, kind in (("step", int), ("world_size", int), ("shards", dict), ("ranks", list)):
        if not isinstance(manifest.get(key), kind):
            raise ManifestError(f"{path}: field {key!r} missing or not {kind.__name__}")
    return manifest


def shard_label(name: str, entry: dict[str, Any]) -> str:
    """`__1_0.distcp (rank 1)`: how problems name a file."""
    return f"{name} (rank {entry.get('rank', '?')})"


def missing_or_resized(directory: Path, manifest: dict[str, Any]) -> list[str]:
    """Shards that are absent or of the wrong size: a cheap (stat-only) completeness check."""
    problems = []
    for name, entry in manifest["shards"].items():
        try:
            size = (directory / name).stat().st_size
        except FileNotFoundError:
            problems.append(f"{directory.name}: shard {shard_label(name, entry)} is missing")
            continue
        if size != entry.get("size"):
            problems.append(
                f"{directory.name}: shard {shard_label(name, entry)} has {size} bytes, the manifest says {entry.get('size')}"
            )
    return problems

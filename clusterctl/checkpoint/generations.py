"""Finding generations: the newest committed one, and a listing of everything.

Both read the directory only (no process group), so the controller and the
CLI use them as well as the ranks. A name `step-N` exists only after the
commit's rename, so a generation under that name is whole by construction;
`latest_committed` still checks the manifest and stats every shard, so that a
directory damaged afterwards (a torn copy, a lost file) is skipped in favour
of the next older whole one rather than resumed from. It also returns only a
generation this user may load (checkpoint/trust.py: theirs alone, sealed with
their key); `refusal` says why, when the newest whole one is not.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from clusterctl.checkpoint import durable, names, trust
from clusterctl.checkpoint import manifest as manifest_mod

UNTRUSTED = "untrusted"  # a whole committed generation this user may not load (trust.py)


@dataclass(frozen=True)
class Generation:
    """A committed generation: its step, directory and manifest."""

    step: int
    path: Path
    manifest: dict[str, Any]


@dataclass(frozen=True)
class GenerationInfo:
    """One entry of a checkpoint directory, for listings (`clusterctl checkpoints`)."""

    name: str
    path: Path
    step: int
    kind: str  # committed | untrusted | torn | temporary | trash | superseded
    token: str | None
    size_bytes: int
    mtime: float
    world_size: int | None
    problem: str | None

    @property
    def committed(self) -> bool:
        return self.kind == names.COMMITTED


def _dir_size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
    return total


def open_generation(path: Path) -> Generation:
    """A committed generation from its directory; ManifestError if it is not whole."""
    path = Path(path)
    parsed = names.parse(path.name)
    manifest = manifest_mod.read(path)
    if parsed is not None and parsed.kind == names.COMMITTED and parsed.step != manifest["step"]:
        raise manifest_mod.ManifestError(f"{path}: manifest says step {manifest['step']}")
    problems = manifest_mod.missing_or_resized(path, manifest)
    if problems:
        raise manifest_mod.ManifestError("; ".join(problems))
    return Generation(int(manifest["step"]), path, manifest)


def _entries(directory: Path) -> list[tuple[names.ParsedName, Path]]:
    try:
        with os.scandir(directory) as it:
            found = [(names.parse(e.name), Path(e.path)) for e in it if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []
    return [(p, path) for p, path in found if p is not None]


def _whole(directory: Path) -> Iterator[Generation]:
    """Every whole committed generation, newest first, read lazily (the newest is usually the one wanted)."""
    committed = [(p.step, path) for p, path in _entries(Path(directory)) if p.kind == names.COMMITTED]
    for _step, path in sorted(committed, reverse=True):
        try:
            yield open_generation(path)
        except (manifest_mod.ManifestError, OSError):
            continue


def latest_committed(directory: str | Path, key: bytes | None = None) -> Generation | None:
    """The newest whole committed generation this user may load (`key`: the run's, trust.run_key), or None;
    never a temporary, torn or untrusted one."""
    key = trust.run_key() if key is None else key
    return next((g for g in _whole(Path(directory)) if trust.refused(g.path, g.manifest, key) is None), None)


def resumable(directory: str | Path, key: bytes | None = None) -> tuple[Generation | None, str | None]:
    """What a resume loads: the newest whole committed generation and None, or None and why it may not be loaded
    (a run must not start over, or from an older step, in silence because its newest state is not trusted)."""
    key = trust.run_key() if key is None else key
    newest = next(_whole(Path(directory)), None)
    why = trust.refused(newest.path, newest.manifest, key) if newest is not None else None
    return (None, why) if why else (newest, None)


def refusal(directory: str | Path, key: bytes | None = None) -> str | None:
    """Why the newest whole committed generation may not be loaded, or None when it may (or there is none)."""
    return resumable(directory, key)[1]


def committed_steps(directory: Path) -> list[int]:
    """Steps with a committed-looking name, newest first (no completeness check)."""
    return sorted((p.step for p, _ in _entries(directory) if p.kind == names.COMMITTED), reverse=True)


def list_generations(directory: str | Path, key: bytes | None = None) -> list[GenerationInfo]:
    """Every generation-like entry, committed or not, newest step first."""
    key = trust.run_key() if key is None else key
    infos = []
    for parsed, path in _entries(Path(directory)):
        kind, problem, world = parsed.kind, None, None
        if parsed.kind == names.COMMITTED:
            try:
                generation = open_generation(path)
                world = generation.manifest["world_size"]
                problem = trust.refused(path, generation.manifest, key)
                kind = UNTRUSTED if problem else kind
            except (manifest_mod.ManifestError, OSError) as exc:
                kind, problem = "torn", str(exc)
        infos.append(
            GenerationInfo(
                name=path.name,
                path=path,
                step=parsed.step,
                kind=kind,
                token=parsed.token,
                size_bytes=_dir_size(path),
                mtime=durable.newest_mtime(path),
                world_size=world,
                problem=problem,
            )
        )
    order = {names.COMMITTED: 0, UNTRUSTED: 1, "torn": 1, names.TEMPORARY: 2, names.SUPERSEDED: 3, names.TRASH: 4}
    return sorted(infos, key=lambda i: (-i.step, order.get(i.kind, 9), -i.mtime))

"""Verification: every file of a generation against the sizes and checksums in its manifest.

Reads every byte (unlike `latest_committed`, which only stats), so it is for
the CLI, the controller before a resume it has doubts about, and tests. Each
problem names the file and the rank that wrote it, so a bad disk or node can
be found from the message alone.
"""

from __future__ import annotations

from pathlib import Path

from clusterctl.checkpoint import manifest as manifest_mod
from clusterctl.checkpoint import names
from clusterctl.checkpoint.checksums import file_checksum
from clusterctl.checkpoint.generations import Generation


def verify(generation_or_path: Generation | str | Path) -> list[str]:
    """Problems found in a generation; [] when every file matches its manifest."""
    path = generation_or_path.path if isinstance(generation_or_path, Generation) else Path(generation_or_path)
    try:
        manifest = manifest_mod.read(path)
    except manifest_mod.ManifestError as exc:
        return [str(exc)]
    problems: list[str] = []
    parsed = names.parse(path.name)
    if parsed is not None and parsed.kind == names.COMMITTED and parsed.step != manifest["step"]:
        problems.append(f"{path.name}: the manifest says step {manifest['step']}")
    listed = set(manifest["shards"])
    for name, entry in manifest["shards"].items():
        label = manifest_mod.shard_label(name, entry)
        try:
            size, checksum = file_checksum(path / name)
        except FileNotFoundError:
            problems.append(f"{path.name}: shard {label} is missing")
            continue
        except OSError as exc:
            problems.append(f"{path.name}: shard {label} cannot be read ({exc.strerror})")
            continue
        if size != entry.get("size"):
            problems.append(f"{path.name}: shard {label} has {size} bytes, the manifest says {entry.get('size')}")
        elif checksum != entry.get("checksum"):
            problems.append(
                f"{path.name}: shard {label} is corrupt: checksum {checksum}, the manifest says {entry.get('checksum')}"
            )
    if names.DCP_METADATA not in listed and not str(manifest.get("mode", "")).startswith(manifest_mod.FILES_MODE):
        problems.append(f"{path.name}: the manifest lists no {names.DCP_METADATA} (DCP's index)")
    for extra in sorted(p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()):
        if extra not in listed and extra != names.MANIFEST:
            problems.append(f"{path.name}: file {extra} is not in the manifest")
    return problems

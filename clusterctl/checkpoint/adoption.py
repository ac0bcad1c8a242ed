"""Trusting a checkpoint once: `clusterctl checkpoints DIR --adopt` (trust.py says why generations are sealed).

A generation written before seals existed, or copied in from another run or
user, is refused at submit and before a load. Adopting it says "I know where
this came from": each such generation that is wholly this user's and whose
every byte matches its manifest is sealed with this user's key, and is then
resumed from like any other. One that does not verify, or holds a file of
someone else's, is left as it is and said why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusterctl.checkpoint import manifest as manifest_mod
from clusterctl.checkpoint import trust
from clusterctl.checkpoint.generations import UNTRUSTED, list_generations
from clusterctl.checkpoint.verify import verify


@dataclass(frozen=True)
class Adopted:
    name: str
    problem: str | None  # why it was not adopted; None when it now carries this user's seal


def adopt_untrusted(directory: Path, key: bytes) -> list[Adopted]:
    """Seal every untrusted generation of `directory` that is this user's alone and verifies, newest first."""
    done = []
    for info in list_generations(directory, key):
        if info.kind != UNTRUSTED:
            continue
        why = trust.not_owned(info.path)
        if why:
            done.append(Adopted(info.name, f"{why}: copy it into a checkpoint directory of yours, then adopt the copy"))
            continue
        problems = verify(info.path)
        if problems:
            done.append(Adopted(info.name, "; ".join(problems)))
            continue
        trust.adopt(info.path, manifest_mod.read(info.path), key)
        done.append(Adopted(info.name, None))
    return done

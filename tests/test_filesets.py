"""A framework's checkpoint files committed as a generation: listed, verified, resumed from, pruned."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.checkpoint import latest_committed, list_generations, verify
from clusterctl.checkpoint.filesets import commit_files, move_into


def framework_folder(root: Path, step: int) -> Path:
    """What the Hugging Face Trainer leaves: a folder with the model, the optimizer and one RNG file per rank."""
    folder = root / f"checkpoint-{step + 1}"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w" * 1000 + bytes([step % 256]))
    (folder / "rng_state_0.pth").write_bytes(b"r0")
    (folder / "sub" / "rng_state_1.pth").write_bytes(b"r1")
    return folder


def test_a_framework_folder_becomes_a_committed_generation_that_verifies(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"
    for step in (9, 19, 29):
        generation = commit_files(ckpt, step, move_into(framework_folder(tmp_path / "out", step)),
                                  framework="hf", keep=2, world_size=2)
        assert not (tmp_path / "out" / f"checkpoint-{step + 1}").exists()  # moved, not copied
    latest = latest_committed(ckpt)
    assert latest is not None and latest.step == 29 == generation.step and latest.path == generation.path
    assert (latest.path / "sub" / "rng_state_1.pth").read_bytes() == b"r1"
    assert latest.manifest["mode"] == "files:hf" and latest.manifest["world_size"] == 2
    assert verify(latest) == []
    assert [(g.step, g.kind) for g in list_generations(ckpt)] == [(29, "committed"), (19, "committed")]  # keep 2, newest first

    (latest.path / "model.safetensors").write_bytes(b"x" * 1001)  # same size, other bytes
    assert any("model.safetensors" in p and "corrupt" in p for p in verify(latest)), verify(latest)
    (latest.path / "sub" / "rng_state_1.pth").unlink()
    assert latest_committed(ckpt).step == 19  # a generation missing a file is not resumed from


def test_a_save_that_fails_part_way_commits_nothing_and_the_next_one_clears_it(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints"

    def torn(tmp: Path) -> None:
        (tmp / "lightning.ckpt").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        commit_files(ckpt, 9, torn, framework="lightning", keep=2, world_size=4, owner="abcd0001")
    assert latest_committed(ckpt) is None and list_generations(ckpt) == []
    commit_files(ckpt, 19, lambda tmp: (tmp / "lightning.ckpt").write_bytes(b"whole"), framework="lightning",
                 keep=2, world_size=4, owner="abcd0001")
    assert [(g.step, g.kind) for g in list_generations(ckpt)] == [(19, "committed")]

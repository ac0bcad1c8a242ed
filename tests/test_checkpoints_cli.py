"""`clusterctl checkpoints`: generations listed, the latest marked, a corrupt shard named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from clusterctl.checkpoint import Checkpointer, CheckpointError  # noqa: E402
from clusterctl.cli import app  # noqa: E402


@pytest.fixture
def generations(tmp_path: Path) -> Path:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ckpt = Checkpointer(tmp_path / "ckpt", keep=2, rank=0, world_size=1)
        for step in (9, 19, 29):
            ckpt.save(step, {"w": torch.full((256,), float(step))}, {"step": step})
        ckpt.close()
    finally:
        dist.destroy_process_group()
    (tmp_path / "ckpt" / ".tmp-step-00000039-deadbeef").mkdir()  # a save a crash interrupted
    return tmp_path / "ckpt"


def test_lists_committed_and_unfinished_generations(generations: Path) -> None:
    result = CliRunner().invoke(app, ["checkpoints", str(generations), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["generations"]
    committed = [r for r in rows if r["kind"] == "committed"]
    assert [r["step"] for r in committed] == [29, 19]  # keep=2 retired step 9
    assert committed[0]["latest"] and all(r["verified"] for r in committed)
    assert any(r["kind"] == "temporary" and r["step"] == 39 for r in rows)


def test_a_corrupt_shard_is_named_and_fails(generations: Path) -> None:
    shard = next((generations / "step-00000029").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = CliRunner().invoke(app, ["checkpoints", str(generations)])
    assert result.exit_code == 65
    assert shard.name in result.output


def latest(directory: Path) -> int | None:
    """What a resuming job would load: rank 0's choice, as every rank hears it (CheckpointError when refused)."""
    store = dist.FileStore(str(directory.parent / "resume-store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with Checkpointer(directory, keep=2, rank=0, world_size=1) as ckpt:
            found = ckpt.latest()
            return found.step if found is not None else None
    finally:
        dist.destroy_process_group()
        (directory.parent / "resume-store").unlink(missing_ok=True)


def unseal(generation: Path) -> None:
    """The generation as a launcher without seals (or clusterctl before them) wrote it."""
    manifest = json.loads((generation / "manifest.json").read_text())
    manifest.pop("seal")
    (generation / "manifest.json").write_text(json.dumps(manifest))


def test_a_generation_without_this_users_seal_is_refused_until_adopted(generations: Path) -> None:
    assert latest(generations) == 29
    unseal(generations / "step-00000029")
    with pytest.raises(CheckpointError, match=f"clusterctl checkpoints {generations} --adopt"):
        latest(generations)  # never in silence from step 19 or from scratch: the newest state is refused, loudly
    rows = json.loads(CliRunner().invoke(app, ["checkpoints", str(generations), "--json"]).stdout)["generations"]
    assert [(r["step"], r["kind"]) for r in rows if r["step"] in (19, 29)] == [(29, "untrusted"), (19, "committed")]
    adopted = CliRunner().invoke(app, ["checkpoints", str(generations), "--adopt"])
    assert adopted.exit_code == 0, adopted.output
    assert "adopted step-00000029: verified and sealed with your key" in adopted.output
    assert latest(generations) == 29


def test_a_seal_made_with_another_key_or_a_file_others_can_write_is_refused(generations: Path) -> None:
    manifest = json.loads((generations / "step-00000029" / "manifest.json").read_text())
    manifest["seal"]["hmac"] = "0" * 64  # another user's key makes another MAC
    (generations / "step-00000029" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="not made with your key"):
        latest(generations)
    assert CliRunner().invoke(app, ["checkpoints", str(generations), "--adopt"]).exit_code == 0
    shard = next((generations / "step-00000029").glob("*.distcp"))
    shard.chmod(0o666)
    with pytest.raises(CheckpointError, match="is not yours alone"):
        latest(generations)


def test_a_copy_that_does_not_verify_is_not_adopted(generations: Path) -> None:
    unseal(generations / "step-00000029")
    shard = next((generations / "step-00000029").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = CliRunner().invoke(app, ["checkpoints", str(generations), "--adopt"])
    assert "not adopted step-00000029" in result.output and "corrupt" in result.output
    with pytest.raises(CheckpointError, match="no seal"):
        latest(generations)

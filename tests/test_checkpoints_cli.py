"""`clusterctl checkpoints`: generations listed, the latest marked, a corrupt shard named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from clusterctl.checkpoint import Checkpointer  # noqa: E402
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

"""The reference trainer: FSDP2 with checkpoints, the MLP, heartbeats, the data-parallel-only guard."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.helpers import free_port

import pytest

from clusterctl.runtime.heartbeat import Heartbeat
from clusterctl.trainer.sampler import DistributedSampler


def run_ranks(work: Path, *args: str, world: int = 2) -> list[str]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERCTL_")}
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "clusterctl.trainer", "--out-dir", str(work), "--checkpoint-dir", str(work / "ckpt"),
             "--seq-len", "16", "--hidden", "32", "--ffn", "64", "--micro", "2", *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=180)
        assert p.returncode == 0, out
        outs.append(out)
    return outs


def test_fsdp2_trains_checkpoints_and_resumes(tmp_path: Path) -> None:
    first = run_ranks(tmp_path, "--parallel", "fsdp", "--steps", "6", "--checkpoint-interval", "3", "--eval-interval", "3")
    assert "training transformer (fsdp) on 2 ranks from step 0" in first[0]
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-00000002", "step-00000005"]
    second = run_ranks(tmp_path, "--parallel", "fsdp", "--steps", "8", "--checkpoint-interval", "3")
    assert "from step 6 to 8" in second[0]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert records[-1]["loss"] < records[0]["loss"]
    summary = json.loads((tmp_path / "trainer-summary.json").read_text())
    assert summary["steps"] == 2 and summary["tokens_per_s"] > 0 and summary["step_s"]["p50"] > 0


def test_mlp_reaches_its_target(tmp_path: Path) -> None:
    out = run_ranks(tmp_path, "--model", "mlp", "--steps", "120", "--eval-interval", "20", "--target-loss", "0.05",
                    "--micro", "16", "--lr", "0.003", world=1)
    summary = json.loads((tmp_path / "trainer-summary.json").read_text())
    assert summary["target_reached"] is not None, out
    assert summary["target_reached"]["val_loss"] <= 0.05


def test_refuses_tensor_parallel_it_does_not_implement(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from clusterctl.trainer.loop import check_layout

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"parallel": {"tp": 2, "pp": 1, "cp": 1, "ep": 1, "dp": 2}}))
    monkeypatch.setenv("CLUSTERCTL_RUN_DIR", str(run))
    with pytest.raises(SystemExit, match="data parallel only.*tp=2"):
        check_layout()


def test_sampler_partitions_are_disjoint_and_reshuffled_per_epoch() -> None:
    ranks = [DistributedSampler(40, r, 4, seed=3) for r in range(4)]
    epoch0 = [s.take(10) for s in ranks]
    assert sorted(i for ids in epoch0 for i in ids) == list(range(40))
    epoch1 = [s.take(10) for s in ranks]
    assert sorted(i for ids in epoch1 for i in ids) == list(range(40)) and epoch1 != epoch0
    resumed = DistributedSampler(40, 1, 4, seed=3)
    fresh = DistributedSampler(40, 1, 4, seed=3)
    fresh.take(13)
    resumed.load_state_dict(fresh.state_dict())
    assert resumed.take(5) == fresh.take(5)


def test_heartbeats_reach_the_aggregator_socket_and_cost_nothing_without_one() -> None:
    silent = Heartbeat(rank=3)
    assert not silent.enabled
    silent.phase("forward", 1)  # no socket, no thread, no error
    silent.close()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "agg.sock")
        agg = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        agg.bind(path)
        agg.settimeout(5)
        beat = Heartbeat(rank=3, attempt=2, socket_path=path, liveness_s=0.1)
        beat.phase("forward", 7)
        beat.step_done(7, 0.5, 0.4)
        kinds = []
        deadline = time.monotonic() + 5
        while len(kinds) < 4 and time.monotonic() < deadline:
            msg = json.loads(agg.recv(65536))
            kinds.append(msg["kind"])
            assert msg["rank"] == 3 and msg["attempt"] == 2 and msg["step"] == 7
        beat.close()
        agg.close()
        assert kinds[:2] == ["phase", "step"] and "alive" in kinds[2:]
        with pytest.raises(ValueError, match="unknown phase"):
            Heartbeat(rank=0).phase("sleeping")

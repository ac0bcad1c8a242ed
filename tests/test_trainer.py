"""The reference trainer: FSDP2 with checkpoints, the MLP, heartbeats, the data-parallel-only guard."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from clusterctl.runtime.rank.heartbeat import Heartbeat
from clusterctl.trainer.sampler import DistributedSampler
from tests.helpers import free_port


def run_ranks(work: Path, *args: str, world: int = 2, env_extra: dict[str, str] | None = None) -> list[str]:
    port = free_port()
    procs = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLUSTERCTL_")}
        env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", **(env_extra or {}))
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


def test_step_compute_busy_work_counts_as_compute_and_evaluation_reports_its_phase(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "agg.sock")
        agg = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        agg.bind(path)
        agg.settimeout(0.2)
        messages: list[dict] = []
        done = threading.Event()

        def drain() -> None:  # the receive queue holds only a few datagrams: read while the ranks run
            while not done.is_set():
                try:
                    messages.append(json.loads(agg.recv(65536)))
                except socket.timeout:
                    pass

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        try:
            out = run_ranks(tmp_path, "--model", "mlp", "--steps", "6", "--eval-interval", "3", "--eval-samples", "8",
                            "--step-compute-s", "0.2", env_extra={"CLUSTERCTL_HEARTBEAT_SOCKET": path})
        finally:
            done.set()
            reader.join()
            agg.close()
    assert "step_compute_s 0.2:" in out[0] and "units/s" in out[0]
    summary = json.loads((tmp_path / "trainer-summary.json").read_text())
    assert summary["step_compute_s"] == 0.2 and summary["busy_units_per_s"] > 0
    # the summary rounds the rate it shows, so the units a step were sized from may differ from it by one
    assert abs(summary["busy_units_per_step"] - 0.2 * summary["busy_units_per_s"]) <= 1, summary
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(6))
    # The busy work is inside compute_s every step (without it a step computes for a few milliseconds), and
    # it is sized for 0.2 s. Its wall time is only about that: the work per step is fixed, the CPU share
    # is not, and with other processes busy on a 2-core machine the ranks' short bursts get more CPU than
    # the sustained calibration did, so steps have averaged 0.12-0.2 s, single ones 0.04-0.4 s.
    computed = [r["compute_s"] for r in records] + [m["compute_s"] for m in messages if m["kind"] == "step"]
    assert min(computed) >= 0.02 and statistics.mean(computed) >= 0.08, computed
    # Evaluation reports its own phase, between the step's collective and its idle. The datagrams are
    # lossy by design (a full receive queue drops them), so each evaluation must be seen from one rank.
    phases = [(m["rank"], m["step"], m["phase"]) for m in messages if m["kind"] == "phase"]
    assert {step for _, step, phase in phases if phase == "eval"} == {2, 5}, phases
    for rank in (0, 1):
        mine = [(step, phase) for r, step, phase in phases if r == rank]
        for at, (step, phase) in enumerate(mine):
            if phase == "eval":
                before = mine[at - 1]
                assert before[0] == step and before[1] in ("forward", "backward", "optimizer", "collective"), mine
                assert at + 1 == len(mine) or mine[at + 1] == (step, "idle") or mine[at + 1][0] > step, mine


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
        hello = json.loads(agg.recv(65536))  # sent on construction, before any phase
        assert hello["kind"] == "hello" and hello["rank"] == 3 and hello["phase"] == "start"
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

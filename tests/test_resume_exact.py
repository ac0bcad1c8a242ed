"""Resume exactness: a run killed mid-way and resumed from its latest committed
checkpoint continues with exactly the samples and bitwise the losses of a run
that was never interrupted.

Real processes (four ranks, gloo, env://), a real SIGKILL, deterministic
algorithms and one thread per rank. Four, not two: a sum of two gradients is
the same in any order, so only 3 or more ranks show a resumed step summing in
another bucket layout than the uninterrupted run (clusterctl/trainer/buckets.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import free_port

STEPS, INTERVAL = 40, 4  # commits after steps 3, 7, 11, ...
WORLD = 4


def start(work: Path, parallel: str) -> list[subprocess.Popen]:
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(WORLD),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
        )
        for key in [k for k in env if k.startswith("CLUSTERCTL_")]:
            del env[key]
        args = [
            sys.executable, "-m", "clusterctl.trainer",
            "--steps", str(STEPS), "--checkpoint-interval", str(INTERVAL), "--record-samples", "--parallel", parallel,
            "--micro", "2", "--grad-accum", "2", "--seq-len", "16", "--hidden", "32", "--ffn", "64",
            "--eval-interval", "0", "--out-dir", str(work), "--checkpoint-dir", str(work / "ckpt"),
        ]
        log = open(work / f"rank{rank}.log", "a")
        procs.append(subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def records(work: Path) -> list[dict]:
    path = work / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def samples(work: Path, rank: int) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for line in (work / f"samples-rank{rank}.jsonl").read_text().splitlines():
        row = json.loads(line)
        out[row["step"]] = row["ids"]  # a recomputed step overwrites the killed run's record
    return out


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])  # DDP's replicated state, FSDP2's sharded state
def test_resumed_run_matches_the_uninterrupted_one(tmp_path: Path, parallel: str) -> None:
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    whole.mkdir()
    broken.mkdir()
    for p in start(whole, parallel):
        assert p.wait(120) == 0, (whole / "rank0.log").read_text()

    procs = start(broken, parallel)
    deadline = time.monotonic() + 120
    while not any(r["step"] >= 9 for r in records(broken)):  # past at least the commit after step 7
        assert time.monotonic() < deadline and procs[0].poll() is None, (broken / "rank0.log").read_text()
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGKILL)
    procs[1].wait(30)
    for p in procs:  # their peer is gone: in a real job srun --kill-on-bad-exit ends them
        p.kill()
        p.wait(30)
    killed_at = max(r["step"] for r in records(broken))
    assert killed_at < STEPS - 1
    from clusterctl.checkpoint import latest_committed

    committed = latest_committed(broken / "ckpt")
    assert committed is not None and 7 <= committed.step <= killed_at

    for p in start(broken, parallel):
        assert p.wait(120) == 0, (broken / "rank0.log").read_text()
    log = (broken / "rank0.log").read_text()
    resumed_from = int(log.split("from step ")[-1].split()[0])
    assert resumed_from == committed.step + 1, log  # from the latest committed generation, not the last step seen

    reference = {r["step"]: r["loss_hex"] for r in records(whole)}
    resumed = [r for r in records(broken)][-(STEPS - resumed_from):]
    assert [r["step"] for r in resumed] == list(range(resumed_from, STEPS))
    for r in resumed:
        assert r["loss_hex"] == reference[r["step"]], r["step"]  # bitwise
    for rank in range(WORLD):
        want, got = samples(whole, rank), samples(broken, rank)
        assert [got[s] for s in range(STEPS)] == [want[s] for s in range(STEPS)]
    # Nothing skipped or repeated: the resumed run's ids continue where the checkpoint left off.
    ids = [i for s in range(STEPS) for r in range(WORLD) for i in samples(broken, r)[s]]
    assert len(ids) == len(set(ids)) == STEPS * WORLD * 2 * 2

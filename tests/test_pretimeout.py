"""The pre-timeout path end to end: the batch shell traps the signal, the
controller sets the stop flag, the trainer saves and commits at its next
step and the attempt ends with 85 — on the local backend and on real Slurm.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import BACKEND_SITES

from clusterctl.actions.submit import submit_job
from clusterctl.backends import get_backend
from clusterctl.checkpoint import latest_committed
from clusterctl.exitcodes import ExitCode
from clusterctl.plan.job import load_job
from clusterctl.rundir import history


def test_signal_to_the_batch_shell_saves_commits_and_exits_85(backend: str, tmp_path: Path) -> None:
    spec = {
        "name": "pretimeout",
        "site": BACKEND_SITES[backend],
        "time_limit": "20m",
        "nodes": 2,
        "gpus_per_node": 1,
        "signal": {"name": "USR2", "lead_s": 60},
        "checkpoint": {"interval": 100000, "keep": 2},
        "runs_root": str(tmp_path / "runs"),
        "model": {"layers": 1, "hidden": 32, "heads": 2, "vocab": 64, "ffn": 64},
        "seq_len": 16,
        "command": ["python3", "-m", "clusterctl.trainer", "--steps", "100000", "--eval-interval", "0"],
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(spec))
    done = submit_job(load_job(path), backend)
    run = done.run
    metrics = run.attempt(1) / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 5):
        assert time.monotonic() < deadline, (run.path / f"slurm-{done.job_id}.out").read_text()
        time.sleep(0.2)
    scancel = ["scancel", "--signal=USR2", "--batch", done.job_id]
    if backend == "local":
        from clusterctl.backends.local import BIN_DIR  # the emulated scancel

        scancel[0] = str(BIN_DIR / "scancel")
    subprocess.run(scancel, check=True)
    be = get_backend(backend)
    while not ((info := be.info(done.job_id)) and info.finished):
        assert time.monotonic() < deadline + 60
        time.sleep(0.3)
    log = (run.path / f"slurm-{done.job_id}.out").read_text()
    events = [e for e in history.read_events(run.events_file) if e.get("job_id") == done.job_id]  # the continuation's come after
    assert [e["event"] for e in events] == ["start", "signal", "end", "next"], log
    assert events[2]["exit"] == ExitCode.PRE_TIMEOUT, log
    assert events[3]["how"] == "continuation" and info.state == "COMPLETED", (events, info)  # a clean stop, not FAILED
    assert "stop requested" in log
    last_step = json.loads(metrics.read_text().splitlines()[-1])["step"]
    generation = latest_committed(run.path / "checkpoints")
    assert generation is not None, list((run.path / "checkpoints").iterdir())
    assert generation.step == last_step  # saved at the step where the ranks stopped

"""A killed, a hung and a slow torch rank, end to end: `clusterctl submit`, then `clusterctl drill` from outside.

On 2 nodes x 2 ranks (gloo), on the local backend and on the real Slurm test
cluster: the reference trainer, and a user's plain DDP script that imports
nothing of clusterctl (examples/own-script/train_ddp.py, run as shipped),
whose steps clusterctl learns from torch's own hooks. The drill injects the
fault with real signals (through `srun --overlap` on Slurm); the test
asserts what a user checks: the drill's report, verdict.json's culprit and
victims, the survivors' stacks after a hang, and the attempt's exit code.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import BACKEND_SITES
from helpers import cli

from clusterctl.actions.submit import Submitted, submit_job
from clusterctl.backends import get_backend
from clusterctl.exitcodes import ExitCode
from clusterctl.plan.job import load_job
from clusterctl.rundir import history

PLAIN_DDP = Path(__file__).resolve().parents[1] / "examples" / "own-script" / "train_ddp.py"


def submit(backend: str, tmp_path: Path, name: str) -> Submitted:
    command = {"command": ["python3", str(PLAIN_DDP)], "env": {"STEPS": "100000", "BUSY_S": "0.1"}}
    spec = {
        "name": name,
        "site": BACKEND_SITES[backend],
        "time_limit": "20m",
        "nodes": 2,
        "gpus_per_node": 2,
        "runs_root": str(tmp_path / "runs"),
        "checkpoint": {"interval": 100000},
        "restart": {"mode": "none"},  # detection only: the verdict ends the run (test_recovery_e2e restarts)
        "model": {"layers": 1, "hidden": 32, "heads": 2, "vocab": 64, "ffn": 64},
        "seq_len": 16,
        **command,
    }
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(spec))
    return submit_job(load_job(path), backend)


def wait_finished(backend: str, done: Submitted, log: str) -> None:
    be = get_backend(backend)
    deadline = time.monotonic() + 60
    while not ((info := be.info(done.job_id)) and info.finished):
        assert time.monotonic() < deadline, log
        time.sleep(0.3)


@pytest.mark.parametrize("fault, target, code", [("hang", 1, ExitCode.HANG), ("slow", 2, ExitCode.STRAGGLER)])
def test_drill_names_the_culprit_of_a_torch_job(backend: str, tmp_path: Path, fault: str, target: int, code: ExitCode) -> None:
    """The plain DDP example, unchanged (a killed rank's blame: test_recovery_e2e's killed-rank case). Each
    fault on one backend: the injector runs on both (a subprocess, a step in the allocation), and the verdict
    is the controller's on either."""
    if (backend, fault) in (("local", "hang"), ("slurm", "slow")):
        pytest.skip("each fault runs on one backend: the hang on the test cluster, the straggler on the local one")
    done = submit(backend, tmp_path, f"drill-{fault}")
    run = done.run
    how = f"{target}:1.5" if fault == "slow" else str(target)
    result = cli("drill", str(run.path), f"--{fault}", how, "--timeout", "150", "--json")
    log = (run.path / f"slurm-{done.job_id}.out").read_text()
    assert result.exit_code == 0, (result.output, log)
    report = json.loads(result.stdout)
    assert report["detected"] and report["culprit_right"] and report["code"] == code, report
    assert report["seconds"] < {"hang": 20, "slow": 30}[fault], report

    wait_finished(backend, done, log)
    attempt = run.attempt(1)
    verdict = json.loads((attempt / "verdict.json").read_text())
    hosts = json.loads((attempt / "attempt.json").read_text())["hosts"]
    assert verdict["code"] == code
    assert [c["rank"] for c in verdict["culprits"]] == [target]
    assert verdict["culprits"][0]["host"] == hosts[target // 2]
    victims = sorted(v["rank"] for v in verdict["victims"])
    if fault == "slow":  # the peers waited for it: not failures, and the run's own metrics show the steps
        steps = [json.loads(line)["step"] for line in (attempt / "metrics.jsonl").read_text().splitlines()]
        assert steps[:3] == [0, 1, 2] and len(steps) >= 20, steps[:30]
        return
    assert victims == sorted(set(range(4)) - {target})
    end = [e for e in history.read_events(run.events_file) if e["event"] == "end"]
    assert end[-1]["attempt"] == 1 and end[-1]["exit"] == code, log
    for rank in victims:  # each survivor says where it waited: in the collective
        stack = (attempt / verdict["evidence"]["stacks"][str(rank)]).read_text()
        assert "train_ddp.py" in stack, stack
    assert not (attempt / "stacks" / f"rank-{target}.txt").exists()  # the stopped rank could not answer


def test_drill_losing_a_node_blames_the_node_not_its_peers(backend: str, tmp_path: Path) -> None:
    if backend == "slurm":
        pytest.skip("on the Slurm test cluster a lost node is drilled by test_recovery_e2e (verdict 86, then the continuation)")
    done = submit(backend, tmp_path, "drill-node")
    attempt = done.run.attempt(1)
    deadline = time.monotonic() + 120
    while not (attempt / "attempt.json").exists():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    hosts = json.loads((attempt / "attempt.json").read_text())["hosts"]
    lost = hosts[1]  # not the first node: it runs the batch script and the controller
    result = cli("drill", str(done.run.path), "--node", lost, "--timeout", "150", "--json")
    log = (done.run.path / f"slurm-{done.job_id}.out").read_text()
    assert result.exit_code == 0, (result.output, log)
    report = json.loads(result.stdout)
    assert report["detected"] and report["culprit_right"] and report["code"] == ExitCode.NODE_LOST, report
    wait_finished(backend, done, log)
    verdict = json.loads((attempt / "verdict.json").read_text())
    assert [(c["rank"], c["host"]) for c in verdict["culprits"]] == [(2, lost), (3, lost)]
    assert sorted(v["rank"] for v in verdict["victims"]) == [0, 1]
    assert verdict["evidence"]["node"] == lost
